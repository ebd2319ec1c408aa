"""The node programs as slurmd runs them: ``python -I prolog/prolog.py`` with slurmd's env.

Slurm's commands are replaced by scripts earlier on PATH that log their argv: the
programs find ``sinfo``/``scontrol`` through PATH exactly as on a real node.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.cli.main import main as cli_main
from slurm_robust.health.node_ledger import EventKind, LedgerConfig, NodeEvent, NodeLedger

REPO = Path(__file__).resolve().parents[3]
SINFO_JSON = {"nodes": [{"name": "node2", "state": "allocated", "state_flags": [],
                         "reason": "", "partitions": ["train"], "cpus": 2}]}


@pytest.fixture()
def node_env(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "slurm_calls.log"
    for cmd in ("sinfo", "scontrol", "squeue"):
        script = fake / cmd
        body = f"printf '%s\\n' '{json.dumps(SINFO_JSON)}'\n" if cmd == "sinfo" else ""
        script.write_text(f"#!/bin/sh\necho {cmd} \"$@\" >> {log}\n{body}")
        script.chmod(0o755)
    conf = tmp_path / "site.json"
    conf.write_text(json.dumps({"state_dir": str(tmp_path / "{node}"),
                                "injection_enabled": True,
                                "ledger": {"dir": str(tmp_path / "ledger"),
                                           "lemons_file": str(tmp_path / "lemons.json")},
                                "checks": {"deep_collective": {"enabled": False}}}))
    return {"PATH": f"{fake}:{os.environ['PATH']}", "SLURM_ROBUST_CONFIG": str(conf),
            "SLURMD_NODENAME": "node2", "SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1001",
            "SLURM_JOB_NAME": "$(touch /tmp/pwned)", "SLURM_LOG": str(log)}


def run_program(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", str(REPO / name / f"{name}.py")], env=env,
                          capture_output=True, text=True, timeout=120)


def calls(env: dict[str, str]) -> list[str]:
    log = Path(env["SLURM_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def test_healthy_prolog_exits_zero_and_calls_no_slurm_command(node_env: dict[str, str]) -> None:
    proc = run_program("prolog", node_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"] is True
    assert calls(node_env) == []


def test_failing_prolog_drains_with_the_check_reason(node_env: dict[str, str]) -> None:
    state = Path(node_env["SLURM_ROBUST_CONFIG"]).parent / "node2"
    state.mkdir()
    (state / "inject.json").write_text(json.dumps({"xid_events": [{"gpu": 3, "xid": 79}]}))
    proc = run_program("prolog", node_env)
    assert proc.returncode == 1
    assert calls(node_env) == [
        "sinfo --json",
        "scontrol update nodename=node2 state=drain reason=slurm_robust: gpu_xid: Xid 79 on "
        "GPU 3, expected no critical Xid"]
    journal = (state / "health" / "node2.jsonl").read_text().splitlines()
    assert any(json.loads(line)["status"] == "fail" for line in journal)


def _ledger(node_env: dict[str, str]) -> NodeLedger:
    tmp = Path(node_env["SLURM_ROBUST_CONFIG"]).parent
    return NodeLedger(LedgerConfig(dir=str(tmp / "ledger")))


def _fail_prolog(node_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    state = Path(node_env["SLURM_ROBUST_CONFIG"]).parent / "node2"
    state.mkdir()
    (state / "inject.json").write_text(json.dumps({"xid_events": [{"gpu": 3, "xid": 79}]}))
    return run_program("prolog", node_env)


def test_failing_prolog_records_the_check_and_the_drain_in_the_node_ledger(
        node_env: dict[str, str]) -> None:
    proc = _fail_prolog(node_env)
    assert proc.returncode == 1
    events = _ledger(node_env).history("node2")
    assert [(e.kind, e.source, e.job_id) for e in events] == [
        (EventKind.CHECK_FAILED, "prolog", "4242"), (EventKind.DRAIN, "prolog", "4242")]
    assert events[0].check == "gpu_xid"
    assert "Xid 79" in events[1].evidence["reason"]


def test_a_locked_node_ledger_delays_the_drain_by_its_busy_timeout_at_most(
        node_env: dict[str, str]) -> None:
    """Another writer holds the database's write lock for the whole run: the prolog
    still drains and fails the job, warns on one line, and waits no longer than the
    busy timeout (0.2 s here) for the lock."""
    conf = Path(node_env["SLURM_ROBUST_CONFIG"])
    site = json.loads(conf.read_text())
    site["ledger"]["busy_timeout_s"] = 0.2
    conf.write_text(json.dumps(site))
    ledger = _ledger(node_env)
    ledger.record([NodeEvent("node1", EventKind.DRAIN, "test")])  # creates the database
    holder = sqlite3.connect(ledger.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        proc = _fail_prolog(node_env)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 1
    assert calls(node_env)[-1].startswith("scontrol update nodename=node2 state=drain")
    assert "node ledger not updated" in proc.stderr and "locked" in proc.stderr
    assert ledger.history("node2") == []


def test_a_broken_node_ledger_does_not_stop_the_drain(node_env: dict[str, str]) -> None:
    """A corrupt database file (not SQLite at all): the drain happens, one warning."""
    ledger = _ledger(node_env)
    ledger.dir.mkdir(mode=0o700)
    ledger.path.write_bytes(b"this is not a database" * 100)
    ledger.path.chmod(0o600)
    proc = _fail_prolog(node_env)
    assert proc.returncode == 1
    assert calls(node_env)[-1].startswith("scontrol update nodename=node2 state=drain")
    assert "node ledger not updated" in proc.stderr


def test_failing_epilog_drains_with_the_deep_check_reason(node_env: dict[str, str]) -> None:
    state = Path(node_env["SLURM_ROBUST_CONFIG"]).parent / "node2"
    state.mkdir()
    (state / "inject.json").write_text(json.dumps({"shm_free_bytes": 0}))
    assert run_program("prolog", node_env).returncode == 0  # deep-only probe
    proc = run_program("epilog", node_env)
    assert proc.returncode == 1
    assert calls(node_env)[-1].startswith(
        "scontrol update nodename=node2 state=drain reason=slurm_robust: deep_shm_free: "
        "actual 0.00 GiB free in /dev/shm")


def test_broken_site_config_fails_closed(node_env: dict[str, str]) -> None:
    conf = Path(node_env["SLURM_ROBUST_CONFIG"])
    conf.write_text(json.dumps({"checks": {"gpu_xyd": {}},
                                "ledger": json.loads(conf.read_text())["ledger"]}))
    proc = run_program("prolog", node_env)
    assert proc.returncode == 1
    assert "unknown check(s) ['gpu_xyd']" in calls(node_env)[-1]


def test_bad_node_name_from_environment_is_refused(node_env: dict[str, str]) -> None:
    proc = run_program("prolog", {**node_env, "SLURMD_NODENAME": "../etc"})
    assert proc.returncode == 1
    assert calls(node_env) == []


def test_bench_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "prolog", "--runs", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == 3 and out["min_s"] <= out["median_s"] <= out["max_s"]
    assert out["target_median_s"] == 1.5


def test_check_cli_json_and_exit_code(node_env: dict[str, str]) -> None:
    env = {**os.environ, **node_env}
    cmd = [sys.executable, "-m", "slurm_robust.cli.main", "check", "--node", "node2", "--json"]
    ok = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["suite"] == "quick"
    state = Path(node_env["SLURM_ROBUST_CONFIG"]).parent / "node2"
    (state / "inject.json").write_text(json.dumps({"mem_available_bytes": 5}))
    bad = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["reason"].startswith("slurm_robust: host_mem_available:")
    assert calls(node_env) == []  # `check` never drains
