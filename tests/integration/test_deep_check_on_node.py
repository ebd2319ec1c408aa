"""Deep checks run on the node they judge, through Slurm.

`node resume` and a node drained "pending deep check" (a job's blame) are answered by the
node's own slurmd running slurm_robust's HealthCheckProgram, not by the calling host:
with node3's deep suite forced to fail by a probe injection on node3 only, the calling
host passes the same suite, yet `node resume node3` refuses, and the outcome record shows
node3's slurmd ran it. A pending node that passes returns to service by itself.

The break-fix loop (health/repair.py) with two rounds and a reboot every round: a blamed
node that passes goes through the mini-cluster's reboot (its slurmd restarted) and comes
back by itself; one whose deep suite keeps failing is rebooted twice and handed to a
human.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import wait_until

from slurm_robust.health import read_journal
from slurm_robust.health.journal import journal_path
from slurm_robust.health.repair import load_record
from slurm_robust.node_deep_check import OUTCOME_FILE
from slurm_robust.records import read_records
from slurm_robust.site_config import load_site_config
from slurm_robust_rehearsal.cluster.manager import MiniCluster
from slurm_robust_rehearsal.cluster.templates import render_robust_conf
from slurm_robust_rehearsal.inject.probes import clear_injections, inject_probe

pytestmark = pytest.mark.integration

#: Two HealthCheckIntervals (10 s each on the mini-cluster) plus the deep suite and Slurm.
RETURN_BOUND_S = 60.0


@pytest.fixture()
def site(minicluster: Any) -> Any:
    return load_site_config(minicluster.cfg.robust_conf)


def cli(minicluster: Any, *args: str, user: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    env = {**minicluster.env, "SLURM_ROBUST_CONFIG": str(minicluster.cfg.robust_conf)}
    argv = [sys.executable, "-m", "slurm_robust.cli.main", *args]
    if user is not None:
        argv = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={env['SLURM_CONF']}",
                f"SLURM_ROBUST_CONFIG={env['SLURM_ROBUST_CONFIG']}", *argv]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)


def outcomes(site: Any, node: str) -> list[dict[str, Any]]:
    return read_records(site.state_path(node) / OUTCOME_FILE, "slurm_robust.deep_check").records


@contextlib.contextmanager
def held_idle(minicluster: Any, site: Any, node: str) -> Iterator[str]:
    """``node`` idle and ours for the test; put back in service after.

    Its health journal is set aside and put back after, without this test's runs: a
    deliberately failed deep check here must not make the node a repeat offender in a
    later test.
    """
    slurm = minicluster.slurm
    wait_until(f"{node} idle", lambda: slurm.node(node).idle, 90)
    journal = journal_path(node, site)
    saved = journal.with_name(journal.name + ".saved")
    if journal.exists():
        journal.rename(saved)
    try:
        yield node
    finally:
        clear_injections(site, node)
        n = slurm.node(node)
        if n.drained and n.reason.startswith("slurm_robust:"):
            slurm.resume(node)
        if saved.exists():
            saved.rename(journal)
        else:
            journal.unlink(missing_ok=True)


@pytest.fixture()
def idle_node(minicluster: Any, site: Any, request: Any) -> Iterator[str]:
    """The node named by the test's parameter, held idle (see held_idle)."""
    with held_idle(minicluster, site, request.param) as node:
        yield node


@pytest.mark.parametrize("idle_node", ["node3"], indirect=True)
def test_resume_runs_the_check_on_the_node_and_refuses_a_failing_node(
        minicluster: Any, site: Any, idle_node: str) -> None:
    node, slurm = idle_node, minicluster.slurm
    # The calling host is healthy: the same deep suite run here (for another node's
    # name, so no injection applies) passes.
    here = cli(minicluster, "check", "--stage", "epilog", "--node", "node1", "--no-journal",
               "--json")
    assert here.returncode == 0 and json.loads(here.stdout)["passed"], here.stdout + here.stderr
    slurm.drain(node, "slurm_robust: gpu_xid: Xid 79 on GPU 3 (an earlier failure)")
    inject_probe(site, node, "shm_free_bytes", 0)  # read only by the deep suite
    seen = len(outcomes(site, node))

    out = cli(minicluster, "node", "resume", node, "--json")

    assert out.returncode == 1, out.stdout + out.stderr
    res = json.loads(out.stdout)
    assert res["resumed"] is False and res["passed"] is False
    assert res["reason"].startswith("slurm_robust: deep check failed: deep_shm_free"), res
    n = slurm.node(node)
    assert n.drained and n.reason.startswith("slurm_robust: deep check failed: deep_shm_free")
    # Where it ran: node3's own slurmd started the check (its SLURMD_NODENAME), and the
    # run it journaled on node3 is the failing, injected deep suite.
    new = outcomes(site, node)[seen:]
    assert [o["action"] for o in new] == ["drained"], new
    assert new[0]["slurmd_node"] == node and new[0]["passed"] is False
    run = [r for r in read_journal(node, site) if r["run_id"] == new[0]["run_id"]]
    assert {r["stage"] for r in run} == {"resume"}
    shm = [r for r in run if r["check"] == "deep_shm_free"]
    assert shm and shm[0]["status"] == "fail" and shm[0]["injected"] is True


@pytest.mark.parametrize("idle_node", ["node4"], indirect=True)
def test_pending_deep_check_node_returns_to_service_by_itself(
        minicluster: Any, site: Any, idle_node: str) -> None:
    node, slurm = idle_node, minicluster.slurm
    seen = len(outcomes(site, node))
    # What a job's blame leaves (the handoff drains with this prefix).
    slurm.drain(node, "slurm_robust: pending deep check: gpu_memory_error from job 1")
    wait_until(f"{node} back in service", lambda: not slurm.node(node).drained,
               RETURN_BOUND_S, interval_s=1.0)
    new = outcomes(site, node)[seen:]
    assert [o["action"] for o in new] == ["resumed"], new
    assert new[0]["slurmd_node"] == node and new[0]["passed"] is True


@pytest.mark.parametrize("idle_node", ["node4"], indirect=True)
def test_resume_is_refused_to_an_unprivileged_user(minicluster: Any, site: Any,
                                                    idle_node: str) -> None:
    node, slurm = idle_node, minicluster.slurm
    slurm.drain(node, "slurm_robust: gpu_xid: Xid 79 on GPU 3")
    out = cli(minicluster, "node", "resume", node, user=minicluster.cfg.attacker)
    assert out.returncode != 0 and "may not drain or resume nodes" in out.stderr, \
        out.stdout + out.stderr
    n = slurm.node(node)
    assert n.drained and n.reason == "slurm_robust: gpu_xid: Xid 79 on GPU 3"


@pytest.fixture()
def repair_loop(minicluster: Any) -> Iterator[dict[str, Any]]:
    """Two rounds, a reboot every round, the mini-cluster's reboot command."""
    conf = minicluster.cfg.robust_conf
    saved = conf.read_text()
    raw = json.loads(saved)
    command = json.loads(render_robust_conf(minicluster.cfg))["repair"]["reboot_command"]
    raw["repair"] = {"rounds": 2, "reboot": "always", "reboot_command": command,
                     "reboot_timeout_s": 120}
    conf.write_text(json.dumps(raw))
    try:
        yield raw["repair"]
    finally:
        conf.write_text(saved)


def slurmd_pid(minicluster: Any, node: str) -> int | None:
    return MiniCluster(minicluster.cfg).daemon(f"slurmd-{node}").pid(minicluster.cfg.root)


def test_break_fix_loop_reboots_and_returns_a_node_or_hands_it_to_a_human(
        minicluster: Any, site: Any, repair_loop: dict[str, Any]) -> None:
    slurm = minicluster.slurm
    with held_idle(minicluster, site, "node3") as healthy, \
            held_idle(minicluster, site, "node4") as broken:
        inject_probe(site, broken, "shm_free_bytes", 0)  # read only by the deep suite
        seen = {n: len(outcomes(site, n)) for n in (healthy, broken)}
        started = time.time()
        pids = {n: slurmd_pid(minicluster, n) for n in (healthy, broken)}
        for n in (healthy, broken):  # what a job's blame leaves
            slurm.drain(n, "slurm_robust: pending deep check: gpu_xid: Xid 79 from job 7")

        # Deep check, reboot, re-validation: two HealthCheckProgram runs and a restart.
        wait_until(f"{healthy} back in service", lambda: not slurm.node(healthy).drained,
                   3 * RETURN_BOUND_S, interval_s=1.0)
        new = outcomes(site, healthy)[seen[healthy]:]
        assert [o["action"] for o in new] == ["rebooting", "resumed"], new
        assert all(o["slurmd_node"] == healthy and o["passed"] for o in new), new
        assert slurmd_pid(minicluster, healthy) not in (None, pids[healthy])
        assert load_record(site.state_path(healthy), healthy) is None

        # Two rounds of deep check, reboot, failed re-validation, then a human.
        wait_until(f"{broken} handed to a human", lambda: slurm.node(broken).reason
                   .startswith("slurm_robust: deep check failed:"), 5 * RETURN_BOUND_S,
                   interval_s=1.0)
        n = slurm.node(broken)
        assert n.drained and n.reason.startswith(
            "slurm_robust: deep check failed: deep_shm_free"), n.reason
        assert n.reason.endswith("(2 repair rounds)"), n.reason
        new = outcomes(site, broken)[seen[broken]:]
        assert [o["action"] for o in new] == \
            ["rebooting", "next_round", "rebooting", "drained"], new
        record = load_record(site.state_path(broken), broken)
        assert record is not None and record.round == 2 and record.phase.value == "human"
        assert [(h["round"], h["step"]) for h in record.history] == [
            (1, "deep_check"), (1, "reboot"), (1, "revalidate"),
            (2, "deep_check"), (2, "reboot"), (2, "revalidate")]
        out = cli(minicluster, "node", "status", broken, "--json")
        assert out.returncode == 0, out.stderr
        row = json.loads(out.stdout)["nodes"][0]
        assert row["repair"] == {"phase": "human", "round": 2, "rounds": 2}, row
        assert row["last_step"]["step"] == "revalidate" and not row["last_step"]["passed"]
        # The ledger has every round for the human.
        out = cli(minicluster, "node", "history", broken, "--json")
        assert out.returncode == 0, out.stderr
        kinds = [e["kind"] for e in json.loads(out.stdout)["events"]
                 if e["time"] >= started]
        assert kinds.count("repair") == 3 and kinds.count("deep_check_failed") == 4, kinds
