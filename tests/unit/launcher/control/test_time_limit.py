"""Slurm's warning before the time limit: the agent notes the signal (and its workers
survive it), the controller takes the first report that carries it as one ``time_limit``
incident, and the ladder requeues the job without spending the restart budget, or stops
a run that makes no step within an allocation."""

from __future__ import annotations

import os
import subprocess
import sys

from slurm_robust.launcher.control.ladder import Facts, decide
from slurm_robust.launcher.enums import Phase, Role, Rung
from slurm_robust.launcher.messages import Report
from slurm_robust.launcher.worker_signals import WARNING_SIGNAL
from tests.unit.launcher.control.test_recovery_owner import Harness


def _facts(**kw) -> Facts:
    base = {"cls": "time_limit", "controller_node": "n1", "spares_left": 1, "restarts": 0,
            "max_restarts": 10, "signature": None, "signature_seen": 0, "no_progress": 0,
            "max_no_progress": 3}
    return Facts(**{**base, **kw})


def test_the_ladder_requeues_whatever_the_budget():
    d = decide(_facts(restarts=10, max_restarts=10))
    assert d.rung is Rung.REQUEUE and d.evict == () and "time limit" in d.reason


def test_an_allocation_without_a_step_stops_the_run():
    # Failures in between (no progress) are no reason: only the time limit's own count.
    assert decide(_facts(no_progress=5)).rung is Rung.REQUEUE
    d = decide(_facts(time_limit_stalled=True))
    assert d.rung is Rung.STOP and "--time" in d.reason


def test_a_second_warning_with_no_step_since_the_first_stops(tmp_path):
    from slurm_robust.launcher.control.actions import Handle
    from slurm_robust.launcher.control.run_facts import ladder_facts
    from slurm_robust.launcher.control.time_limit import TimeLimitWatch, time_limit_incident

    h = Harness(tmp_path)
    h.start()
    st, gen = h.rec.state, h.rec.gen
    inc = time_limit_incident("i9", TimeLimitWatch(warned_at=1.0), st.last_step, 2.0)

    def facts():
        return ladder_facts(Handle(gen, inc, None, []), st, h.cfg, "n1", 1, True, None,
                            None, 3.0)

    assert not facts().time_limit_stalled  # the first warning
    assert facts().time_limit_stalled      # again at the same step: nothing was done
    h.steps(1)
    assert not facts().time_limit_stalled  # a step since: progress


def test_the_warning_requeues_the_job_once_and_counts_no_restart(tmp_path):
    h = Harness(tmp_path)
    h.start()
    restarts = h.rec.state.restarts
    for m in h.slot_members():  # every agent's report carries it from now on
        h.rec.on_time_limit(m, h.clock() - 0.5)
    h.tick()
    h.wait_slurm()
    assert h.rec.phase is Phase.REQUEUED
    assert ("requeue", "42", []) in h.slurm.calls  # no node excluded: none is to blame
    assert {h.rec.plan_for(i).role for i in h.members} == {Role.HOLD}
    inc = h.rec.state.open_incident.to_json()
    assert inc["class"] == "time_limit" and inc["category"] == "manual"
    assert inc["rung"] == "requeue" and inc["nodes"] == []
    assert inc["evidence"]["time_limit"]["first_node"] == "n1"
    assert h.rec.state.restarts == restarts and h.rec.state.requeues == 1
    h.tick()
    assert [c for c in h.slurm.calls if c[0] == "requeue"] == [("requeue", "42", [])]


def test_the_report_carries_the_warning_only_once_set():
    base = {"op": "report", "agent": 0, "node": "n1", "pid": 1, "key": "k", "time": 1.0}
    assert "warned" not in Report(**base).to_json()
    assert Report.from_json({**Report(**base, warned=5.0).to_json()}).warned == 5.0


def test_a_process_that_does_not_listen_survives_the_warning():
    """Slurm signals every process of the step (workers too), and a requeued job's new
    allocation may get a stale warning before the agent listens: the signal's default
    action must be to ignore it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, WARNING_SIGNAL)
        try:
            child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        assert child.poll() is None, "the warning ended a process that had no handler"
    finally:
        child.kill()
        child.wait()


def test_a_step_finished_while_the_requeue_waits_is_no_recovery(tmp_path):
    """The warned generation runs on until Slurm ends it: its next step is recorded (the
    next allocation restores it) but does not close the incident."""
    h = Harness(tmp_path)
    h.start()
    h.rec.on_time_limit(h.slot_members()[0], h.clock())
    h.tick()
    h.wait_slurm()
    h.steps(1)
    assert h.rec.state.last_step == 4
    assert h.rec.state.open_incident is not None and h.incidents() == []


def test_the_end_time_is_the_backstop_for_a_lost_signal(tmp_path):
    """Slurm 22.05 sends a requeued job's warning at launch, before any agent listens,
    and never again: the job's end time, read from Slurm, triggers the same requeue."""
    h = Harness(tmp_path, warn_before_s=60.0)
    h.start()
    h.rec.limit.end_time = h.clock() + 90  # as the last read said: not due yet
    h.tick()
    assert h.rec.phase is Phase.RUNNING
    h.clock.advance(31)
    h.tick()
    h.wait_slurm()
    assert h.rec.phase is Phase.REQUEUED
    ev = h.rec.state.open_incident.to_json()["evidence"]["time_limit"]
    assert ev["source"] == "end_time" and ev["signal"] is None and ev["warn_before_s"] == 60


def test_the_end_time_is_read_in_a_thread_once_a_minute():
    from slurm_robust.launcher.control.time_limit import TimeLimitWatch

    reads: list[int] = []

    def fetch() -> float:
        reads.append(1)
        return 5000.0

    w = TimeLimitWatch(60.0, fetch)
    w.refresh(1000.0)
    assert w._reader is not None
    w._reader.join(5)
    assert w.end_time == 5000.0 and not w.due(1000.0)
    w.refresh(1030.0)  # within the minute: no new read
    assert len(reads) == 1
    assert w.due(4940.0) and w.source == "end_time" and w.take() and not w.take()


def test_status_says_why_the_run_waits(tmp_path):
    from slurm_robust.launcher.submit.status import format_status, run_status

    h = Harness(tmp_path)
    h.start()
    h.rec.on_time_limit(h.slot_members()[0], h.clock())
    h.tick()
    h.wait_slurm()
    status = run_status(h.cfg.run_dir)
    assert status["pending"].startswith("requeued: the time limit was near")
    assert "goes on from step 3" in format_status(status)


def test_a_warning_longer_than_the_limit_is_refused_before_anything_is_written(tmp_path):
    import pytest

    from slurm_robust.errors import UsageError
    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.submit.executor import SlurmOptions, submit_run

    cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"), warn_before_s=60)
    with pytest.raises(UsageError, match="--warn-before"):
        submit_run(cfg, SlurmOptions(time_min=1))
    assert not (tmp_path / "run").exists()
