"""``slurm-robust stacks capture|analyze`` and ``bench stacks``, through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from slurm_robust.cli.main import main
from slurm_robust.layout import parse_layout
from slurm_robust.stacks.dumps import write_rank_dump
from slurm_robust_rehearsal.synth.stacks import synthetic_capture

SLEEPER = "import time\ndef hold_here():\n    time.sleep(60)\nhold_here()\n"


@pytest.fixture
def sleepers():
    procs: list[subprocess.Popen] = []

    def start(n: int) -> list[int]:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", SLEEPER],
                                          start_new_session=True))
        time.sleep(0.5)
        return [p.pid for p in procs[-n:]]

    yield start
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _write(directory, layout, faults):
    for dump in synthetic_capture(layout, faults):
        write_rank_dump(directory, dump)


def test_analyze_json_names_the_pipeline(tmp_path, capsys):
    layout = parse_layout("tp=2,pp=4,dp=4", ranks_per_node=2)
    _write(tmp_path, layout, {9: "blocked"})
    assert main(["stacks", "analyze", str(tmp_path), "--layout", "tp=2,pp=4,dp=4",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "evict" and out["outlier_ranks"] == [9]
    assert out["eviction"]["dim"] == "pp" and out["eviction"]["groups"] == [[1, 9, 17, 25]]
    assert out["nodes"] == ["node0", "node4", "node8", "node12"]


def test_analyze_text_on_a_run_directory_takes_the_latest_capture(tmp_path, capsys):
    layout = parse_layout("dp=4", ranks_per_node=1)
    old, new = tmp_path / "stacks" / "a", tmp_path / "stacks" / "b"
    _write(old, layout, {})
    time.sleep(0.01)
    _write(new, layout, {2: "blocked"})
    os.utime(new, (time.time() + 5, time.time() + 5))
    assert main(["stacks", "analyze", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert str(new) in text
    assert "OUTLIER" in text and "verdict: evict" in text


def test_analyze_errors_are_one_line_with_exit_2(tmp_path, capsys):
    assert main(["stacks", "analyze", str(tmp_path)]) == 2
    assert "no capture found" in capsys.readouterr().err
    _write(tmp_path, parse_layout("dp=4", ranks_per_node=1), {})
    assert main(["stacks", "analyze", str(tmp_path), "--layout", "tp=3"]) == 2
    assert "outside layout" in capsys.readouterr().err


def test_capture_ad_hoc_pids(sleepers, tmp_path, capsys):
    pids = sleepers(2)
    out = tmp_path / "cap"
    assert main(["stacks", "capture", "--pids", f"0={pids[0]},1={pids[1]}", "--out", str(out),
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nodes"][0]["errors"] == {}
    frames = json.loads((out / "rank1.json").read_text())["processes"][0]["threads"][0]
    assert any(f[0] == "hold_here" for f in frames["frames"])


def test_capture_from_run_dir_agent_files(sleepers, tmp_path, capsys):
    pids = sleepers(4)
    run = tmp_path / "run"
    (run / "agents").mkdir(parents=True)
    for node, ranks in (("node1", (0, 1)), ("node2", (2, 3))):
        workers = {str(r): pids[r] for r in ranks}
        (run / "agents" / f"{node}.json").write_text(
            json.dumps({"node": node, "agent_pid": 1, "workers": workers}))
    (run / "agents" / "node3.json").write_text(json.dumps({"node": "node3", "workers": {}}))
    assert main(["stacks", "capture", "--run-dir", str(run), "--capture-id", "x",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    how = {n["node"]: n["how"] for n in report["nodes"]}
    assert how == {"node1": "local", "node2": "local", "node3": "skipped"}
    dumps = sorted(p.name for p in (run / "stacks" / "x").glob("rank*.json"))
    assert dumps == ["rank0.json", "rank1.json", "rank2.json", "rank3.json"]
    rank2 = json.loads((run / "stacks" / "x" / "rank2.json").read_text())
    assert rank2["node"] == "node2"
    assert main(["stacks", "analyze", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "uniform"


def test_capture_needs_a_target(capsys):
    assert main(["stacks", "capture"]) == 2
    assert "--job J, --run-dir D or --pids" in capsys.readouterr().err


def test_bench_stacks_prints_json(capsys):
    assert main(["bench", "stacks", "--json", "--ranks", "800", "--procs", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["aggregate"]["ranks"] == 800 and out["aggregate"]["correct"]
    assert out["aggregate"]["evicted_dim"] == "pp"
    assert out["capture"]["processes"] == 4 and out["capture"]["errors"] == {}


def _agents(run, node, workers):
    (run / "agents").mkdir(parents=True, exist_ok=True)
    (run / "agents" / f"{node}.json").write_text(
        json.dumps({"node": node, "workers": {str(r): p for r, p in workers.items()}}))


def test_run_dir_capture_distrusts_the_agent_files(sleepers, tmp_path, capsys):
    pids = sleepers(1)
    run = tmp_path / "run"
    _agents(run, "node1", {0: pids[0]})
    # A pid without the job's SLURM_JOB_ID is not dumped.
    assert main(["stacks", "capture", "--run-dir", str(run), "--job", "4242",
                 "--local-only", "--json"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["how"] == "skipped" and "no worker pid" in node["error"]
    # A capture id cannot leave the stacks directory, nor can a symlink.
    assert main(["stacks", "capture", "--run-dir", str(run), "--capture-id", "../x"]) == 2
    assert "plain name" in capsys.readouterr().err
    (tmp_path / "elsewhere").mkdir()
    (run / "stacks").symlink_to(tmp_path / "elsewhere")
    assert main(["stacks", "capture", "--run-dir", str(run), "--capture-id", "c"]) == 2
    assert "outside the run directory" in capsys.readouterr().err


def test_run_dir_capture_refuses_agent_files_others_could_have_planted(sleepers, tmp_path,
                                                                       capsys):
    pids = sleepers(1)
    run = tmp_path / "run"
    _agents(run, "node1", {0: pids[0]})
    agent = run / "agents" / "node1.json"
    agent.chmod(0o666)  # anyone could have named the pids to signal
    assert main(["stacks", "capture", "--run-dir", str(run), "--capture-id", "x"]) == 2
    err = capsys.readouterr().err
    assert "cannot read agent file" in err and "node1.json" in err
    real = tmp_path / "planted.json"
    agent.replace(real)
    real.chmod(0o644)
    agent.symlink_to(real)
    assert main(["stacks", "capture", "--run-dir", str(run), "--capture-id", "x"]) == 2
    assert "symlink" in capsys.readouterr().err
