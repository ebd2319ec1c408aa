"""Handoff on the real mini-cluster: EpilogSlurmctld applies a requeued job's verdicts.

slurmctld runs the real program (``.minicluster/bin/epilog_slurmctld``) at the job's end.
Where the running slurmctld has not activated EpilogSlurmctld (in 22.05 a newly added
EpilogSlurmctld takes effect only after a slurmctld restart: the prep/script plugin reads
it at startup, ``scontrol reconfigure`` does not), the tests run that same wrapper
themselves right after the requeue, with the variables slurmctld sets; the last test
checks that slurmctld really calls it and skips, saying so, when it does not.

The shared cluster's layout is train=node[1-4], standby=spare[1-2]. To stay out of other
tests' way, spare1 and spare2 are held in a reservation that only these tests' jobs ask
for, spare1 joins ``train`` for the test (the job runs there, excluded from node[1-4]),
and spare2 is the reserve's one spare. Teardown restores both partitions, resumes what
we drained and deletes the reservation.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cluster_helpers import wait_until

from slurm_robust.health import run_suite
from slurm_robust.records import read_records
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.verdicts import FILE_MODE, ensure_verdict_root, write_verdict
from slurm_robust.site_config import load_site_config

pytestmark = pytest.mark.integration

RESV = "rtest_handoff"
JOB_SCRIPT = "#!/bin/sh\nsleep 600\n"


@pytest.fixture()
def handoff_env(minicluster, monkeypatch):
    s = minicluster.slurm
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(minicluster.cfg.robust_conf))
    site = load_site_config()
    cfg = reserve_config(site)
    before = {p: s.partition_nodes(p) for p in ("train", cfg.partition)}
    ensure_verdict_root(cfg.verdict_root)
    s.create_reservation(RESV, ["spare1", "spare2"], ["root"], 20)
    s.set_partition_nodes("train", [*before["train"], "spare1"])
    s.set_partition_nodes(cfg.partition, ["spare2"])
    # spare2 must be a spare: idle, undrained, and a passing deep suite within freshness_h.
    assert run_suite("reserve", node="spare2", config=site).passed
    jobs: list[str] = []
    yield s, site, cfg, jobs
    for job in jobs:
        s.cancel(job)
    s.set_partition_nodes("train", before["train"])
    s.set_partition_nodes(cfg.partition, before[cfg.partition])
    for node in ("spare1", "spare2"):
        n = s.node(node)
        if n.drained and n.reason.startswith("slurm_robust:"):
            s.resume(node)
    s.delete_reservation(RESV)
    # The node epilog (deep suite) may drain a node our jobs used after teardown began.
    for node in ("spare1", "spare2"):
        wait_until(f"{node} done completing", lambda n=node: "COMPLETING" not in
                   s.node(n).flags and s.node(n).state != "completing", 60)
        n = s.node(node)
        if n.drained and n.reason.startswith("slurm_robust:"):
            s.resume(node)


# Whether slurmctld itself runs EpilogSlurmctld, once seen (saves a wait per test).
_HOOK: dict[str, bool] = {}


def job_end_applied(minicluster, site, job: str, nodes: str) -> list[dict]:
    """Wait for slurmctld's EpilogSlurmctld to log this job; run it ourselves where the
    hook is not active. An error the hook logged fails the test with its message."""
    records: list[dict] = []
    if _HOOK.get("active", True):
        try:
            records = wait_until("EpilogSlurmctld's verdict-log record",
                                 lambda: verdict_log_for(site, job), 15)
            _HOOK["active"] = True
        except AssertionError:
            _HOOK["active"] = False
    if not records:
        run_epilog_slurmctld(minicluster, job, nodes)
        records = verdict_log_for(site, job)
    errors = [r for r in records if r.get("action") == "error"]
    assert not errors, f"EpilogSlurmctld failed: {errors[0]['why']}"
    return records


def run_epilog_slurmctld(minicluster, job: str, nodes: str) -> None:
    """Run the EpilogSlurmctld program as slurmctld does, with the variables it sets."""
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SLURM_JOB_USER": "root",
           "SLURM_JOB_UID": "0", "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_PARTITION": "train",
           "SLURM_JOB_RESTART_COUNT": "0", **minicluster.cfg.env()}
    program = minicluster.cfg.bin_dir / "epilog_slurmctld"
    proc = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def start_job(s, jobs: list[str]) -> str:
    job = s.sbatch(["-p", "train", "-N", "1", "-x", "node[1-4]", f"--reservation={RESV}",
                    "--requeue", "-o", "/dev/null", "-J", "reserve-handoff"], script=JOB_SCRIPT)
    jobs.append(job)
    wait_until("job running on spare1",
               lambda: (j := s.job(job)) is not None and j.running and j.nodes == ("spare1",))
    return job


def verdict_log_for(site, job: str) -> list[dict]:
    return [r for r in read_records(site.verdict_log).records if r.get("job_id") == job]


def test_verdict_drains_job_node_and_moves_a_spare_into_its_partition(handoff_env,
                                                                    minicluster):
    s, site, cfg, jobs = handoff_env
    job = start_job(s, jobs)
    write_verdict(cfg.verdict_root, "root", job, "spare1", "gpu_xid: Xid 79 on GPU 0",
                  "gpu_memory_error", {"xid": 79}, "inc-1")
    t0 = time.monotonic()
    # Held by its BeginTime (~120 s) until the handoff resets StartTime.
    s.requeue(job, start_now=False)
    job_end_applied(minicluster, site, job, "spare1")
    node = s.node("spare1")
    assert node.drained and node.reason.startswith("slurm_robust:")
    # (spare1 may be a repeat offender from earlier runs: then the reason says so too.)
    assert "gpu_xid: Xid 79 on GPU 0" in node.reason
    # A job's blame is a suspicion: pending the deep check, flat and short.
    assert node.reason.startswith(("slurm_robust: pending deep check: gpu_memory_error: ",
                                   "slurm_robust: repeat offender: "))
    assert len(node.reason) <= 100
    assert "spare2" in s.partition_nodes("train")
    assert "spare2" not in s.partition_nodes(cfg.partition)
    # The move takes effect at once (no slurmctld restart): the job runs on the spare.
    running = wait_until("requeued job running on spare2",
                         lambda: (j := s.job(job)) is not None and j.running and j, 90)
    elapsed = time.monotonic() - t0
    assert running.nodes == ("spare2",) and running.restart_count >= 1
    print(json.dumps({"requeue_to_running_on_spare_s": round(elapsed, 2)}))
    applied = [r for r in verdict_log_for(site, job) if r.get("action") == "drained"]
    assert applied and applied[0]["node"] == "spare1" and applied[0]["handed_over"] == ["spare2"]
    # Renamed to <job>.<restart count seen by the epilog>.done: consumed exactly once.
    done = list((Path(cfg.verdict_root) / "root").glob(f"{job}.*.done"))
    assert len(done) == 1
    assert not (Path(cfg.verdict_root) / "root" / f"{job}.jsonl").exists()


def test_verdict_for_a_node_outside_the_job_changes_nothing_and_is_logged(handoff_env,
                                                                           minicluster):
    s, site, cfg, jobs = handoff_env
    job = start_job(s, jobs)
    other = "node3"
    other_before = s.node(other)
    path = write_verdict(cfg.verdict_root, "root", job, "spare1", "placeholder", "x")
    # Rewrite the file so its only verdict blames a node the job never had.
    path.write_text(path.read_text().replace('"spare1"', f'"{other}"'))
    os.chmod(path, FILE_MODE)  # as written: SlurmUser's group reads it
    s.requeue(job, start_now=False)
    refused = [r for r in job_end_applied(minicluster, site, job, "spare1")
               if r.get("action") == "refused"]
    assert refused[0]["node"] == other and "not in job" in refused[0]["why"]
    after = s.node(other)
    assert (after.drained, after.reason) == (other_before.drained, other_before.reason)
    assert not s.node("spare1").drained
    assert s.partition_nodes(cfg.partition) == ["spare2"]
    assert "spare2" not in s.partition_nodes("train")


def test_node_failing_again_soon_after_return_is_drained_as_repeat_offender(handoff_env,
                                                                           minicluster):
    s, site, cfg, jobs = handoff_env
    s.drain("spare1", "slurm_robust: deep_matmul: actual 0.1 GFLOP/s, expected >= 0.5")
    time.sleep(1.5)  # node events have 1 s resolution: the drain period must be visible
    s.resume("spare1")
    job = start_job(s, jobs)
    time.sleep(1.0)  # slurmdbd records the resume (the event's end) asynchronously
    write_verdict(cfg.verdict_root, "root", job, "spare1", "nccl_error: timeout", "nccl_error")
    s.requeue(job, start_now=False)
    job_end_applied(minicluster, site, job, "spare1")
    reason = s.node("spare1").reason
    # Flat: the new fault and how soon it came back; the earlier drain
    # (deep_matmul) is in the node's history, not nested in the reason.
    assert reason.startswith("slurm_robust: repeat offender: nccl_error: timeout; again ")
    assert reason.endswith("h after return") and "deep_matmul" not in reason


def test_slurmctld_runs_the_epilog_at_job_end(handoff_env):
    """The real hook: slurmctld itself runs EpilogSlurmctld when a job with verdicts ends."""
    s, site, cfg, jobs = handoff_env
    job = start_job(s, jobs)
    path = write_verdict(cfg.verdict_root, "root", job, "spare1", "placeholder", "x")
    path.write_text(path.read_text().replace('"spare1"', '"node3"'))
    s.cancel(job)
    try:
        refused = wait_until("slurmctld's EpilogSlurmctld to log the refusal",
                             lambda: [r for r in verdict_log_for(site, job)
                                      if r.get("action") == "refused"], 20)
    except AssertionError:
        pytest.skip("slurmctld did not run EpilogSlurmctld within 20 s: it was added to "
                    "slurm.conf after slurmctld started; 22.05 picks it up only on a "
                    "slurmctld restart")
    assert refused[0]["node"] == "node3"
