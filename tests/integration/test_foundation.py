"""The access layer against the real mini-cluster: jobs, accounting, drain, requeue, users."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from cluster_helpers import shared_out_dir as _out_dir
from cluster_helpers import wait_until

from slurm_robust.slurm import Job, SlurmCommandError
from slurm_robust_rehearsal.cluster.manager import MiniCluster

pytestmark = pytest.mark.integration


def test_two_node_job_completes_and_sacct_reports_it(minicluster):
    s = minicluster.slurm
    out = _out_dir(minicluster, "two_node")
    job_id = s.sbatch(["-N", "2", "-p", "train", "-o", str(out / "%j.out")],
                      script="#!/bin/sh\nsrun -N2 printenv SLURMD_NODENAME\n")
    wait_until("job end", lambda: (j := s.job(job_id)) is not None and j.finished)
    assert s.job(job_id).state == "COMPLETED"
    names = sorted((out / f"{job_id}.out").read_text().split())
    assert len(names) == 2 and all(n.startswith("node") for n in names)
    # Accounting is written behind the job: right after its end slurmdbd may hold a
    # first record (one node, named "allocation") that the job's own replaces.
    rows = wait_until("sacct record", lambda: [r for r in s.sacct([job_id])
                                              if r.state == "COMPLETED"
                                              and len(r.nodes) == 2], 30)
    assert rows[0].nodes and len(rows[0].nodes) == 2 and rows[0].exit_code == "0:0"


def test_drain_with_reason_reads_back_and_resumes(minicluster):
    s = minicluster.slurm
    node = "node4"
    reason = "slurm_robust: test_check: actual 1, expected 0"
    s.drain(node, reason)
    try:
        n = s.node(node)
        assert n.drained and n.reason == reason
    finally:
        s.resume(node)
    n = wait_until("node back", lambda: (n := s.node(node)).usable and n)
    assert not n.drained and n.reason == ""


def test_requeue_with_immediate_start_runs_again_quickly(minicluster):
    s = minicluster.slurm
    out = _out_dir(minicluster, "requeue")
    # Pinned to one node: the job comes back where the requeue just revoked its
    # credential, and a sleep's epilog is quick, so a StartTime reset made as soon as it
    # is pending would relaunch it within the revocation's second: slurmd refuses that
    # launch and the job ends FAILED (slurm/restart.py).
    job_id = s.sbatch(["-N", "1", "-p", "train", "-w", "node3", "--requeue",
                       "-o", str(out / "%j.out")],
                      script=f"#!/bin/sh\ntouch {out}/started.$SLURM_JOB_ID\nsleep 300\n")
    try:
        # Running in squeue is not enough: Slurm 22.05 kills a batch step whose launch is
        # still in flight when it is requeued ("Killing non-startable batch JobId=N: Job
        # credential revoked"), and the job then ends instead of running again. The
        # requeue is measured from a job whose script has started.
        wait_until("job script started",
                   lambda: s.job(job_id).running and (out / f"started.{job_id}").exists())
        t0 = time.monotonic()
        s.requeue(job_id, start_now=True)

        def back() -> Job | None:
            job = s.job(job_id)
            assert job is not None and not job.finished, \
                f"the requeued job ended ({job.state if job else 'gone'}) instead of running"
            return job if job.running and job.restart_count >= 1 else None

        job = wait_until("job running again", back, timeout_s=60)
        elapsed = time.monotonic() - t0
        assert job.restart_count == 1
        assert elapsed < 15, f"requeue took {elapsed:.1f} s to run again"
    finally:
        s.cancel(job_id)


def test_unprivileged_user_can_submit(minicluster):
    out = _out_dir(minicluster, "user")
    user = minicluster.cfg.user
    env = dict(minicluster.env)
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", "-N", "1", "-o",
         str(out / "%j.out"), "--wrap", "id -un"],
        env=env, capture_output=True, text=True, timeout=30, cwd=str(out))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    s = minicluster.slurm
    wait_until("user job end", lambda: (j := s.job(job_id)) is not None and j.finished)
    job = s.job(job_id)
    assert job.state == "COMPLETED" and job.user == user
    assert (out / f"{job_id}.out").read_text().strip() == user


def test_unprivileged_user_cannot_drain(minicluster):
    env = dict(minicluster.env)
    proc = subprocess.run(["runuser", "-u", minicluster.cfg.user, "--", "scontrol", "update",
                           "nodename=node1", "state=drain", "reason=nope"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert not minicluster.slurm.node("node1").drained


def test_failing_command_names_command_and_slurm_message(minicluster):
    with pytest.raises(SlurmCommandError) as info:
        minicluster.slurm.requeue("999999")
    msg = str(info.value)
    assert "scontrol requeue 999999" in msg and "Invalid job id" in msg


def test_cluster_up_again_is_a_no_op(minicluster):
    rep = MiniCluster(minicluster.cfg).up()
    assert rep.started == []
    assert rep.seconds < 10
    assert os.path.exists(minicluster.cfg.slurm_conf)
