"""`slurm-robust report`: files written, self-contained HTML, headline JSON, usage errors."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust_rehearsal.synth.runs import Fault, synth_run, write_run_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAULTS = [Fault(5, "cuda_error", "spare", restore_back=2, nodes=("node2",)),
          Fault(12, "hang", "in_place", localize_s=None, detect_s=120.0),
          Fault(20, "node_lost", "requeue", restart_s=400.0, nodes=("node2",)),
          Fault(25, "code_change", "in_place")]


@pytest.fixture
def run_dirs(tmp_path: Path) -> tuple[list[Path], list]:
    a = synth_run("a", steps=40, step_time_s=30.0, faults=FAULTS)
    b = synth_run("b", steps=30, step_time_s=30.0, start=1_700_000_500.0,
                  faults=[Fault(10, "nan", "stop", nodes=("node3",))])
    return [write_run_dir(tmp_path / "a", a), write_run_dir(tmp_path / "b", b)], [a, b]


def test_report_counts_exactly_the_injected_faults(run_dirs, tmp_path, capsys):
    dirs, runs = run_dirs
    out = tmp_path / "out"
    assert main(["report", *map(str, dirs), "-o", str(out), "--json"]) == 0
    head = json.loads(capsys.readouterr().out)
    assert head["incidents"] == 5
    assert head["by_category"] == {"explicit": 2, "implicit": 2, "manual": 1}
    # Faults named by legacy class names come back as their taxonomy classes.
    assert head["by_class"] == {"code_data_change": 1, "cuda_error": 1, "job_hang": 1,
                                "nan": 1, "node_lost": 1}
    assert head["by_rung"] == {"in_place": 2, "spare": 1, "requeue": 1, "stop": 1}
    productive = sum(r.truth.productive_s for r in runs)
    wall = sum(r.truth.wall_s for r in runs)
    assert head["ettr"] == pytest.approx(productive / wall)
    assert head["steps_redone"] == 2
    assert head["repeat_offenders"] == ["node2"]
    assert head["unread"]["total"] == 0
    assert json.loads((out / "headline.json").read_text()) == head


def test_html_is_self_contained_with_every_plot(run_dirs, tmp_path):
    dirs, _ = run_dirs
    out = tmp_path / "out"
    assert main(["report", *map(str, dirs), "-o", str(out)]) == 0
    html = (out / "report.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(images) == 5
    assert all(base64.b64decode(img).startswith(PNG_MAGIC) for img in images)
    assert "src='http" not in html and "plots/" not in html
    md = (out / "report.md").read_text()
    assert "## Incidents by class" in md and "| cuda_error |" in md.replace("explicit | ", "")
    for name in ("ettr", "incidents", "step_time", "recovery", "nodes"):
        assert (out / "plots" / f"{name}.png").read_bytes().startswith(PNG_MAGIC)


def test_unreadable_lines_are_reported_not_fatal(run_dirs, tmp_path, capsys):
    dirs, _ = run_dirs
    with open(dirs[0] / "events.jsonl", "a") as fh:
        fh.write("not json\n")
    assert main(["report", str(dirs[0]), "-o", str(tmp_path / "o")]) == 0
    assert "1 input lines/records could not be read" in capsys.readouterr().out
    assert "not json" not in (tmp_path / "o" / "report.md").read_text()
    assert "malformed_lines" in (tmp_path / "o" / "report.md").read_text()


def test_since_until_restrict_incidents(run_dirs, tmp_path, capsys):
    dirs, runs = run_dirs
    first = runs[0].truth.incidents[0]["detected_at"]
    assert main(["report", str(dirs[0]), "-o", str(tmp_path / "o"), "--json",
                 "--until", str(first + 1)]) == 0
    assert json.loads(capsys.readouterr().out)["incidents"] == 1


def test_fleet_view_from_a_recorded_sacct_file(run_dirs, tmp_path, capsys):
    dirs, _ = run_dirs
    sacct = tmp_path / "sacct.txt"
    sacct.write_text(
        "JobID|JobIDRaw|Partition|State|ExitCode|NNodes|NodeList|Submit|Start|End|"
        "ElapsedRaw|JobName\n"
        "1|1|train|NODE_FAIL|0:0|2|node[1-2]|0|0|3600|3600|a\n"
        "1|1|train|COMPLETED|0:0|2|node[1-2]|3600|3600|7200|3600|a\n")
    assert main(["report", str(dirs[0]), "--sacct-file", str(sacct), "-o",
                 str(tmp_path / "o"), "--json"]) == 0
    fleet = json.loads(capsys.readouterr().out)["fleet"]
    assert fleet["requeued_jobs"] == 1 and fleet["node_hours_lost"] == pytest.approx(2.0)


@pytest.mark.parametrize("argv, message", [
    (["report", "-o", "x"], "at least one RUN_DIR"),
    (["report", "/nonexistent/run", "-o", "x"], "not a directory"),
    (["report", ".", "-o", "x", "--since", "yesterday"], "bad time"),
    (["report", ".", "-o", "x", "--since", "10", "--until", "5"], "must be after"),
])
def test_usage_errors_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
