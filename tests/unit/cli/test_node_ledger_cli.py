"""``slurm-robust node history|lemons|pardon``: what an admin sees, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.lemons import read_published
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.site_config import site_config_from_dict


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    raw = {"ledger": {"dir": str(tmp_path / "ledger"),
                      "lemons_file": str(tmp_path / "lemons.json")}}
    conf = tmp_path / "site.json"
    conf.write_text(json.dumps(raw))
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(conf))
    return raw


def blames(site: dict, node: str, jobs: list[str]) -> None:
    assert record_safely([NodeEvent(node, EventKind.BLAME, "epilog_slurmctld", job_id=j,
                                    check="gpu_memory_error",
                                    evidence={"reason": f"Xid 79 in job {j}"}) for j in jobs],
                         site_config_from_dict(site))


def test_history_says_why_a_node_is_a_lemon(site: dict, capsys) -> None:
    blames(site, "node3", ["101", "102", "103"])
    assert main(["node", "history", "node3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node3: LEMON: blamed by 3 distinct jobs in 30 days (threshold 3);"
                          " blamed by job(s) 101, 102, 103")
    assert out.count("blame ") == 3 and "Xid 79 in job 102" in out
    assert main(["node", "history", "node3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["score"]["lemon"] is True and [e["job_id"] for e in got["events"]] == [
        "101", "102", "103"]


def test_lemons_lists_only_lemons_unless_all(site: dict, capsys) -> None:
    blames(site, "node3", ["101", "102", "103"])
    blames(site, "node1", ["101"])
    assert main(["node", "lemons"]) == 0
    out = capsys.readouterr().out
    assert "lemons: 1" in out and "LEMON node3" in out and "node1" not in out
    assert main(["node", "lemons", "--all", "--json"]) == 0
    assert [n["node"] for n in json.loads(capsys.readouterr().out)["nodes"]] == [
        "node3", "node1"]


def test_pardon_clears_the_lemon_and_the_published_list(site: dict, capsys,
                                                        tmp_path: Path) -> None:
    blames(site, "node3", ["101", "102", "103"])
    assert read_published(tmp_path / "lemons.json") == ["node3"]
    assert main(["node", "pardon", "node3", "--why", "GPU 3 replaced"]) == 0
    assert read_published(tmp_path / "lemons.json") == []
    capsys.readouterr()
    main(["node", "history", "node3"])
    out = capsys.readouterr().out
    assert "not a lemon" in out and "pardon" in out and "GPU 3 replaced" not in out.split(
        "\n")[0]


@pytest.mark.parametrize(("argv", "code", "text"), [
    (["node", "history", "node3;id"], 2, "is not a valid node name"),
    (["node", "history", "node3", "--limit", "0"], 2, "--limit 0 must be >= 1"),
    (["node", "history", "node3"], 1, "no node ledger at"),
    (["node", "pardon", "../x"], 2, "is not a valid node name"),
])
def test_bad_input_is_one_line_and_a_non_zero_exit(site: dict, capsys, argv: list[str],
                                                  code: int, text: str) -> None:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert text in err and err.count("\n") == 1


def test_a_ledger_directory_of_another_owner_or_mode_is_refused(site: dict, capsys,
                                                                tmp_path: Path) -> None:
    blames(site, "node3", ["101"])
    (tmp_path / "ledger").chmod(0o755)
    assert main(["node", "lemons"]) == 1
    err = capsys.readouterr().err
    assert "must be a directory owned by uid" in err and err.count("\n") == 1
