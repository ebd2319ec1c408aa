"""Lemons on the real mini-cluster: a node blamed by three different jobs becomes a lemon
in the node ledger, is not handed to a requeued job as a spare, is skipped by a new
submission, and ``node history`` says why.

Layout (the shared cluster's train=node[1-4], standby=spare[1-2]): spare1 and spare2 are
held in a reservation only these tests' jobs ask for. Three jobs run on spare2 (moved
into ``train`` for them), each leaves a verdict blaming it and is cancelled: EpilogSlurmctld
records each verdict as a blame and drains spare2 pending its deep check, which the test
stands in for by resuming it (a deep check that passes). Then spare2 is the reserve's only
member, fresh, idle and in service: a spare in every way but the ledger. A job on spare1
is blamed and requeued: its handoff must find no spare. The conftest pardons every node
before each cluster test, so the lemon is this test's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from cluster_helpers import wait_until

from slurm_robust.health import run_suite
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.records import read_records
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.verdicts import ensure_verdict_root, write_verdict
from slurm_robust.site_config import load_site_config

pytestmark = pytest.mark.integration

RESV = "rtest_lemon"
JOB_SCRIPT = "#!/bin/sh\nsleep 600\n"
LEMON = "spare2"


def cli(minicluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**minicluster.env, "SLURM_ROBUST_CONFIG": str(minicluster.cfg.robust_conf)}
    return subprocess.run([sys.executable, "-m", "slurm_robust.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def lemon_env(minicluster, monkeypatch):
    s = minicluster.slurm
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(minicluster.cfg.robust_conf))
    site = load_site_config()
    cfg = reserve_config(site)
    before = {p: s.partition_nodes(p) for p in ("train", cfg.partition)}
    ensure_verdict_root(cfg.verdict_root)
    s.create_reservation(RESV, ["spare1", "spare2"], ["root"], 30)
    jobs: list[str] = []
    yield s, site, cfg, jobs
    for job in jobs:
        s.cancel(job)
    s.set_partition_nodes("train", before["train"])
    s.set_partition_nodes(cfg.partition, before[cfg.partition])
    for node in ("spare1", "spare2"):
        wait_until(f"{node} done completing", lambda n=node: "COMPLETING" not in
                   s.node(n).flags and s.node(n).state != "completing", 60)
        n = s.node(node)
        if n.drained and n.reason.startswith("slurm_robust:"):
            s.resume(node)
    s.delete_reservation(RESV)
    record_safely([NodeEvent(LEMON, EventKind.PARDON, "test suite")], site)


def run_job_on(s: Any, node: str, jobs: list[str], name: str) -> str:
    job = s.sbatch(["-p", "train", "-N", "1", "-w", node, f"--reservation={RESV}",
                    "--requeue", "-o", "/dev/null", "-J", name], script=JOB_SCRIPT)
    jobs.append(job)
    wait_until(f"job {job} running on {node}",
               lambda: (j := s.job(job)) is not None and j.running and j.nodes == (node,))
    return job


def job_end_logged(minicluster: Any, site: Any, job: str, node: str) -> list[dict]:
    """EpilogSlurmctld's verdict-log records of ``job`` (run by hand where slurmctld has
    not activated the hook, as test_reserve_handoff_cluster does)."""
    def logged() -> list[dict]:
        return [r for r in read_records(site.verdict_log).records if r.get("job_id") == job]
    try:
        return wait_until(f"EpilogSlurmctld's record of job {job}", logged, 20)
    except AssertionError:
        env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SLURM_JOB_USER": "root",
               "SLURM_JOB_UID": "0", "SLURM_JOB_NODELIST": node,
               "SLURM_JOB_PARTITION": "train", "SLURM_JOB_RESTART_COUNT": "0",
               **minicluster.cfg.env()}
        proc = subprocess.run([str(minicluster.cfg.bin_dir / "epilog_slurmctld")], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return logged()


def wait_free(s: Any, node: str) -> None:
    wait_until(f"{node} idle", lambda: "COMPLETING" not in s.node(node).flags
               and s.node(node).state not in ("completing", "allocated", "mixed"), 90)


def test_a_node_blamed_by_three_jobs_is_a_lemon_kept_from_spares_and_submissions(
        lemon_env, minicluster):
    s, site, cfg, jobs = lemon_env
    s.set_partition_nodes("train", [*s.partition_nodes("train"), LEMON])
    s.set_partition_nodes(cfg.partition, [n for n in s.partition_nodes(cfg.partition)
                                          if n != LEMON])
    blamers = []
    for i in range(3):
        job = run_job_on(s, LEMON, jobs, f"lemon-{i}")
        write_verdict(cfg.verdict_root, "root", job, LEMON, f"nccl_error: timeout {i}",
                      "nccl_error", {"try": i})
        s.cancel(job)
        records = job_end_logged(minicluster, site, job, LEMON)
        assert any(r.get("node") == LEMON for r in records), records
        blamers.append(job)
        wait_free(s, LEMON)
        # The deep check on the node would return it; stand in for a pass.
        if s.node(LEMON).drained:
            s.resume(LEMON)

    lemons = json.loads(cli(minicluster, "node", "lemons", "--json").stdout)
    assert [n["node"] for n in lemons["nodes"] if n["lemon"]] == [LEMON]

    # The reserve: spare2 alone in it, fresh and idle, yet not a spare.
    s.set_partition_nodes("train", [n for n in s.partition_nodes("train") if n != LEMON]
                          + ["spare1"])
    s.set_partition_nodes(cfg.partition, [LEMON])
    assert run_suite("reserve", node=LEMON, config=site).passed
    status = json.loads(cli(minicluster, "reserve", "status", "--json").stdout)
    member = next(m for m in status["members"] if m["node"] == LEMON)
    assert member["lemon"] is True and member["spare"] is False

    job = run_job_on(s, "spare1", jobs, "lemon-requeued")
    write_verdict(cfg.verdict_root, "root", job, "spare1", "gpu_xid: Xid 79 on GPU 0",
                  "gpu_memory_error", {"xid": 79})
    s.requeue(job, start_now=False)
    applied = [r for r in job_end_logged(minicluster, site, job, "spare1")
               if r.get("action") == "drained"]
    assert applied and applied[0]["handed_over"] == [] and applied[0]["shortfall"] == 1
    assert LEMON in s.partition_nodes(cfg.partition)
    assert LEMON not in s.partition_nodes("train")
    s.cancel(job)

    # A new submission skips the lemon unless told otherwise.
    for extra, excluded in (([], True), (["--allow-lemons"], False)):
        run_dir = minicluster.cfg.shared_dir / f"test-lemon-{int(time.time() * 1000)}"
        out = cli(minicluster, "submit", "--nodes", "1", "--spares", "0", "--partition",
                  "train", "--json", *extra, "--folder", str(run_dir), "--",
                  sys.executable, "-c", "pass")
        assert out.returncode == 0, out.stderr
        sub = json.loads(out.stdout)["job_id"]
        jobs.append(sub)
        shown = subprocess.run(["scontrol", "show", "job", "-o", sub], env=minicluster.env,
                               capture_output=True, text=True, timeout=30).stdout
        exc = next(f for f in shown.split() if f.startswith("ExcNodeList="))
        assert (LEMON in exc) is excluded, exc
        s.cancel(sub)

    # node history says why.
    out = cli(minicluster, "node", "history", LEMON)
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[0]
    assert head.startswith(f"{LEMON}: LEMON: blamed by 3 distinct jobs")
    for job in blamers:
        assert job in head
    # One blame line per blaming job (a cluster kept across pytest runs holds earlier
    # runs' pardoned blames of this node too: those name other jobs).
    blames = [line for line in out.stdout.splitlines()[1:] if " blame " in line]
    assert sorted(job for job in blamers for line in blames
                  if f"job {job} " in line) == sorted(blamers), blames
