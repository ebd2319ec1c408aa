"""Slurm's warning before the time limit, delivered the way Slurm delivers it, on the
mini-cluster: the job requeues itself and goes on from its newest step.

``scancel --signal=28 JOB`` sends SIGWINCH through slurmctld, slurmd and slurmstepd to
every task of the job's steps, as ``--signal=28@S`` does at the limit minus S (that
sweep runs every 30 s, so the first test sends it itself, to check the exact sequence).
The second runs into a real two-minute limit, allocation after allocation."""

from __future__ import annotations

import subprocess

import pytest

from slurm_robust.launcher.worker_signals import WARNING_SIGNAL
from slurm_robust.records import read_records
from tests.integration.test_launcher_faults import (  # noqa: F401
    TRAIN_ARGS,
    assert_report_counts,
    baseline_sha,
    runs,
    standalone_sha,
)

pytestmark = pytest.mark.integration


def test_the_time_limit_warning_requeues_from_the_newest_step(runs, baseline_sha,  # noqa: F811
                                                             minicluster):
    run = runs("time-limit", spares=0, train_args=TRAIN_ARGS, extra=["--warn-before", "60"])
    run.wait_step(12)
    script = next(run.paths.submitit.glob("*_submission.sh")).read_text()
    assert f"#SBATCH --signal={int(WARNING_SIGNAL)}@60\n" in script, script
    warned = subprocess.run(["scancel", f"--signal={int(WARNING_SIGNAL)}", run.job_id], env=run.env,
                            capture_output=True, text=True, timeout=60)
    assert warned.returncode == 0, warned.stderr
    end = run.wait_end(timeout=300)
    incidents = run.events("incident")
    assert [(i["class"], i["rung"], i["nodes"]) for i in incidents] == \
        [("time_limit", "requeue", [])], (incidents, run.tail())
    inc = incidents[0]
    assert inc["category"] == "manual" and inc["last_step"] >= 12
    starts = {e["attempt"]: e for e in run.events("attempt_start")}
    assert set(starts) == {0, 1}
    assert inc["restored_step"] is not None, inc  # never from scratch
    assert inc["steps_lost"] == inc["last_step"] - inc["restored_step"], inc
    if set(starts[1]["nodes"]) == set(starts[0]["nodes"]):
        # The same nodes again: each one's memory tier held the newest step.
        assert inc["steps_lost"] == 0 and starts[1]["restore_tier"] == "memory", (inc, starts[1])
    # No worker died of the signal: no other incident, and the run is bit-identical.
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end
    assert_report_counts(run, "time_limit", "requeue")
    # A requeue that blames no node still starts at once: EpilogSlurmctld, on the run's
    # restart request, reset Slurm's hold (cred_expire, 20 s here, 120 s by default).
    started = [r for r in read_records(minicluster.cfg.log_dir / "reserve.jsonl").records
               if r.get("job_id") == run.job_id and r.get("action") == "start_now"]
    assert [r["why"] for r in started] == ["StartTime reset"], started


def test_a_run_longer_than_its_time_limit_completes_across_allocations(runs):  # noqa: F811
    """--time 2, warned 90 s before: about 20 s of steps fit in each allocation, so 60
    steps of 0.5 s take two or more (the example's loss spikes past step 70). Slurm's
    signal warns an allocation, or, when a requeued one got it at launch before anyone
    listened, the job's end time read from Slurm does. Every allocation goes on from the
    newest step, and the parameters end as the fault-free run's."""
    steps = ["--steps", "60", "--min-step-time", "0.5"]
    run = runs("time-limit-real", spares=0, train_args=steps,
               extra=["--time", "2", "--warn-before", "90"])
    end = run.wait_end(timeout=480)
    incidents = run.events("incident")
    assert incidents and {(i["class"], i["rung"]) for i in incidents} == \
        {("time_limit", "requeue")}, (incidents, run.tail())
    # Never from scratch once a step was done; an allocation warned before its first
    # step (a slow start on a loaded machine) had nothing to save.
    assert all(i["restored_step"] is not None for i in incidents
               if i["last_step"] is not None), incidents
    assert incidents[-1]["restored_step"] is not None, incidents
    # Each allocation that stepped announced its attempt (at its first step, always
    # written). One that did not was warned before its first step, or restored the final
    # step (the limit came while the last allocation flushed it) and only ended the run.
    starts = {e["attempt"] for e in run.events("attempt_start")}
    assert starts == {e["attempt"] for e in run.events("step")}, run.tail()
    idle = len(incidents) + 1 - len(starts)
    assert 0 <= idle <= sum(1 for i in incidents if i["last_step"] in (None, 60)), \
        (incidents, run.tail())
    assert end["status"] == "completed", run.tail()
    assert end["params_sha256"] == standalone_sha(60)
