"""Requeues Slurm makes without the launcher, on the mini-cluster: an administrator's
``scontrol requeue`` mid-run, and a preemption by a job of a higher-priority partition
over the same nodes (``PreemptType=preempt/partition_prio``, ``PreemptMode=REQUEUE``, a
GraceTime on ``train`` as sites give one). Each time Slurm sends every task SIGTERM and
later SIGKILL; the workers die of it, and none of that may count as a failure. The run
goes on from its newest step in the next allocation, which records the boundary as one
``admin`` or ``preempted`` incident read from Slurm's accounting, and ends with the
fault-free parameters."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from slurm_robust.analysis.allocations import allocation_table
from slurm_robust.analysis.frames import LoadIssues
from slurm_robust.analysis.loaders import load_run_dirs
from slurm_robust.slurm.restart import start_requeued
from tests.integration.test_launcher_faults import (  # noqa: F401
    CLI,
    NODES,
    TRAIN_ARGS,
    assert_report_counts,
    baseline_sha,
    runs,
)

pytestmark = pytest.mark.integration

GRACE_S = 10


def _checked(argv: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (argv, out.stderr)
    return out.stdout


def _one_boundary(run, cls: str) -> dict:
    """The run's one incident: the boundary of class ``cls``, no node, no restart."""
    incidents = run.events("incident")
    assert [(i["class"], i["rung"], i["nodes"]) for i in incidents] == \
        [(cls, "requeue", [])], (incidents, run.tail())
    inc = incidents[0]
    assert inc["category"] == "manual" and inc["restored_step"] is not None, inc
    assert inc["steps_lost"] <= 1, inc  # the newest snapshot, at most a step behind
    assert inc["evidence"]["requeue"]["signalled_at"] is not None, inc  # an agent's SIGTERM
    table = allocation_table(load_run_dirs([run.run_dir], LoadIssues()))
    assert list(table["ended_by"]) == [cls, "completed"], table
    return inc


def test_an_admin_requeue_mid_run_goes_on_from_the_newest_step(runs, baseline_sha,  # noqa: F811
                                                              minicluster):
    run = runs("admin-requeue", spares=0, train_args=TRAIN_ARGS)
    run.wait_step(12)
    # `scontrol requeue`, then StartTime reset as an admin in a hurry does (what the run
    # does with the boundary does not depend on Slurm's 20 s hold here, 120 s by default).
    minicluster.slurm.requeue(run.job_id, start_now=True)
    end = run.wait_end(timeout=300)
    inc = _one_boundary(run, "admin")
    assert inc["evidence"]["requeue"]["slurm_state"] == "REQUEUED", inc
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end
    assert_report_counts(run, "admin", "requeue")


@pytest.fixture
def urgent_partition(minicluster):
    """A partition of a higher PriorityTier over ``train``'s nodes, and a GraceTime on
    ``train``, removed afterwards."""
    env = minicluster.env
    nodes = _checked(["sinfo", "-h", "-p", "train", "-o", "%N"], env).strip()
    _checked(["scontrol", "create", "PartitionName=urgent", f"Nodes={nodes}",
              "PriorityTier=2", "PreemptMode=OFF", "State=UP"], env)
    _checked(["scontrol", "update", "PartitionName=train", f"GraceTime={GRACE_S}"], env)
    yield nodes
    subprocess.run(["scontrol", "delete", "PartitionName=urgent"], env=env, timeout=60)
    subprocess.run(["scontrol", "update", "PartitionName=train", "GraceTime=0"], env=env,
                   timeout=60)


def test_a_preempted_run_waits_then_goes_on_from_the_newest_step(runs, baseline_sha,  # noqa: F811
                                                                 urgent_partition, minicluster):
    run = runs("preempted", spares=0, train_args=TRAIN_ARGS)
    run.wait_step(12)
    # Every node of the partition, exclusively: the robust job must make way.
    total = len(_checked(["scontrol", "show", "hostnames", urgent_partition],
                         run.env).split())
    assert total > NODES
    urgent = _checked(["sbatch", "--parsable", "-p", "urgent", "-N", str(total),
                       "--exclusive", "-o", "/dev/null", "--wrap", "sleep 20"],
                      run.env).strip().split(";")[0]
    try:
        # While the preemptor runs, the robust job waits in the queue and says why.
        deadline = time.time() + 90
        said = None
        while time.time() < deadline:
            state = _checked(["squeue", "-h", "-j", urgent, "-o", "%T"], run.env).strip()
            if state == "RUNNING":
                out = subprocess.run([*CLI, "status", run.run_dir, "--json"], env=run.env,
                                     capture_output=True, text=True, timeout=60)
                said = json.loads(out.stdout).get("pending") if out.returncode == 0 else None
                if said:
                    break
            time.sleep(1.0)
        assert said and "preempted" in said, (said, run.tail())
    finally:
        # The preemptor need not run its course; the requeued job's hold (Slurm's, 20 s
        # here) is reset as an admin would, once the job is pending again.
        subprocess.run(["scancel", urgent], env=run.env, timeout=30)
    start_requeued(minicluster.slurm, run.job_id, time.time(), timeout_s=60)
    end = run.wait_end(timeout=300)
    inc = _one_boundary(run, "preempted")
    assert inc["evidence"]["requeue"]["slurm_state"] == "PREEMPTED", inc
    # From the SIGTERM: the grace Slurm gave, the queue wait and the restore are downtime.
    assert inc["recovered_at"] - inc["fault_time"] >= GRACE_S, inc
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end
    assert_report_counts(run, "preempted", "requeue")
