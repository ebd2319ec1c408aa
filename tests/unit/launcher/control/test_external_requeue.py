"""A requeue the launcher did not make (an admin's ``scontrol requeue``, a preemption, a
node failure Slurm requeued for): the next allocation records it as one incident named
by Slurm's accounting, closed by its first step, with no restart counted and no node
blamed."""

from __future__ import annotations

import threading
from typing import Any

from slurm_robust.launcher.control import external_requeue
from slurm_robust.launcher.control.applier import SlurmSide
from slurm_robust.launcher.control.external_requeue import (
    NOT_ANSWERED,
    AllocationEnd,
    previous_end,
    requeued_outside,
)
from slurm_robust.launcher.control.listeners import Listener
from slurm_robust.launcher.control.recovery import Recovery
from slurm_robust.launcher.control.time_limit import time_limit_incident
from slurm_robust.launcher.enums import Phase
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import Incident
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.slurm import SlurmCommandError
from slurm_robust.slurm.records import parse_sacct_parsable
from tests.unit.launcher.control.test_recovery_owner import Harness, Member

# `sacct -X --duplicates -j 412 --parsable2 --noheader --format=<SACCT_FIELDS>` as Slurm
# 22.05 printed it on the mini-cluster for a job preempted once, then requeued by an
# admin, now running its third allocation.
SACCT = """\
412|robust|robust|PREEMPTED|0:0|node[1-2]|2026-12-03T10:00:00|2026-12-03T10:00:01|2026-12-03T10:05:00|299|train
412|robust|robust|REQUEUED|0:0|node[1-2]|2026-12-03T10:05:00|2026-12-03T10:06:00|2026-12-03T10:09:30|210|train
412|robust|robust|RUNNING|0:0|node[3-4]|2026-12-03T10:09:30|2026-12-03T10:10:00|Unknown|20|train
"""


def test_the_previous_end_is_the_newest_ended_allocation():
    end = previous_end(parse_sacct_parsable(SACCT))
    assert end is not None and end.state == "REQUEUED" and end.nodes == ("node1", "node2")
    assert end.ended_at is not None
    only_running = parse_sacct_parsable(SACCT.splitlines()[2] + "\n")
    assert previous_end(only_running) is None
    cancelled = SACCT.splitlines()[0].replace("PREEMPTED", "CANCELLED by 0")
    assert previous_end(parse_sacct_parsable(cancelled + "\n")).state == "CANCELLED"


def test_only_a_higher_count_with_nothing_open_is_a_requeue_from_outside():
    inc = time_limit_incident("i1", _watch(), 3, 1.0)
    assert requeued_outside(1, 0, None, None)
    assert not requeued_outside(0, 0, None, None)       # the same allocation (failover)
    assert not requeued_outside(1, None, None, None)    # an older state: no count kept
    inc.rung = "requeue"
    assert not requeued_outside(1, 0, inc, None)        # the launcher's own requeue
    inc.rung = "in_place"
    assert requeued_outside(1, 0, inc, None)            # a restart Slurm cut short
    assert not requeued_outside(1, 0, None, "completed")


def _watch():
    from slurm_robust.launcher.control.time_limit import TimeLimitWatch

    return TimeLimitWatch(warned_at=1.0)


def next_allocation(h: Harness, fetch: Any, restart_count: int = 1) -> None:
    """``h`` in the job's next allocation: a new controller over the same run
    directory, Slurm's requeue count ``restart_count``, ``fetch`` as accounting."""
    h.members = {i: Member(i, f"n{i + 1}") for i in range(h.cfg.total_nodes)}
    ident = Identity(index=0, node="n1", job_id="42", step_key=f"42.0.{restart_count}",
                     restart_count=restart_count)
    h.rec = Recovery(h.cfg, ident, h.members, expected=h.cfg.total_nodes,
                     slurm=SlurmSide(requeue=h.slurm.requeue, drain=h.slurm.drain,
                                     verdict=h.slurm.verdict, previous_end=fetch),
                     clock=h.clock)


def _joined(h: Harness) -> None:
    probe = h.rec.app.outside_requeue
    assert probe is not None
    assert probe.wait(5)


def test_a_preemption_is_recorded_in_the_next_allocation_and_closed_by_its_first_step(
        tmp_path):
    h = Harness(tmp_path)
    h.start()  # steps 1-3 in the first allocation, then Slurm preempts it (no word)
    restarts = h.rec.state.restarts
    ended = h.clock() + 0.5
    next_allocation(h, lambda job: AllocationEnd("PREEMPTED", ended, ("n1", "n2")))
    _joined(h)
    h.clock.advance(30.0)  # the queue wait
    h.tick()
    assert h.rec.phase is Phase.RUNNING
    inc = h.rec.state.open_incident
    assert inc is not None and inc.cls == "preempted" and inc.rung == "requeue"
    h.restored(3)
    h.steps(1)
    [rec] = h.incidents()
    assert rec["class"] == "preempted" and rec["category"] == "manual"
    assert rec["nodes"] == [] and rec["rung"] == "requeue"
    assert rec["fault_time"] == ended and rec["last_step"] == 3
    assert rec["restored_step"] == 3 and rec["steps_lost"] == 0
    assert rec["recovered_at"] - rec["fault_time"] >= 29.5  # the queue wait is downtime
    assert rec["evidence"]["requeue"]["slurm_state"] == "PREEMPTED"
    assert rec["evidence"]["requeue"]["previous_nodes"] == ["n1", "n2"]
    # A fact, not a decision: nothing asked of Slurm, no restart spent, no node blamed.
    assert h.slurm.calls == [] and h.rec.state.restarts == restarts
    assert h.rec.state.blamed == [] and h.rec.state.restart_count == 1


def test_an_admin_requeue_and_a_node_failure_are_named_as_slurm_ended_them(tmp_path):
    for state, cls in (("REQUEUED", "admin"), ("NODE_FAIL", "node_lost")):
        h = Harness(tmp_path / state)
        h.start()
        at = h.clock()
        next_allocation(h, lambda job, s=state, t=at: AllocationEnd(s, t, ("n2",)))
        _joined(h)
        h.tick()
        h.restored(3)
        h.steps(1)
        [rec] = h.incidents()
        assert (rec["class"], rec["nodes"], rec["rung"]) == (cls, [], "requeue")


def test_accounting_that_fails_leaves_an_admin_incident_that_says_so(tmp_path):
    h = Harness(tmp_path)
    h.start()

    def broken(job: str) -> AllocationEnd | None:
        raise SlurmCommandError(["sacct"], 1, "slurmdbd: Connection refused")

    next_allocation(h, broken)
    _joined(h)
    h.tick()
    h.restored(3)
    h.steps(1)
    [rec] = h.incidents()
    assert rec["class"] == "admin" and rec["fault_time"] is None
    assert "Connection refused" in rec["evidence"]["requeue"]["error"]


def test_accounting_slower_than_the_agents_still_names_the_cause(tmp_path):
    """Under load slurmdbd answers after the agents have gathered: the incident opens as
    ``admin`` and takes the cause (and the live count) when the answer comes."""
    h = Harness(tmp_path)
    h.start()
    release = threading.Event()
    ended = h.clock() - 5.0  # before this allocation's controller started

    def slow(job: str) -> AllocationEnd | None:
        release.wait(10)
        return AllocationEnd("PREEMPTED", ended, ("n1", "n2"))

    next_allocation(h, slow)
    counted: list[str] = []
    h.rec.app.listeners.append(_Counting(counted))
    h.tick()
    inc = h.rec.state.open_incident
    assert inc is not None and inc.cls == "admin" and counted == []
    assert inc.evidence["requeue"]["error"] == NOT_ANSWERED
    release.set()
    assert h.rec.app.outside_requeue is None  # handed to the incident
    _wait_answered(h)
    h.tick()
    assert inc.cls == "preempted" and counted == ["preempted"]
    h.restored(3)
    h.steps(1)
    [rec] = h.incidents()
    assert rec["class"] == "preempted" and rec["fault_time"] == ended
    assert rec["evidence"]["requeue"]["slurm_state"] == "PREEMPTED"
    assert rec["evidence"]["requeue"]["error"] is None and counted == ["preempted"]


def test_accounting_without_the_ended_record_yet_is_asked_again(tmp_path, monkeypatch):
    """Slurm's count says the previous allocation ended; an answer without its record
    means accounting lags, so the probe asks again (within LAG_BUDGET_S)."""
    monkeypatch.setattr(external_requeue, "LAG_RETRY_S", 0.01)
    h = Harness(tmp_path)
    h.start()
    answers = [None, None, AllocationEnd("PREEMPTED", h.clock(), ("n1",))]
    asked: list[str] = []

    def lagging(job: str) -> AllocationEnd | None:
        asked.append(job)
        return answers[min(len(asked), len(answers)) - 1]

    next_allocation(h, lagging)
    _joined(h)
    assert len(asked) == 3
    h.tick()
    h.restored(3)
    h.steps(1)
    [rec] = h.incidents()
    assert rec["class"] == "preempted"


def test_a_read_still_unanswered_when_written_stays_admin_and_says_so(tmp_path):
    h = Harness(tmp_path)
    h.start()
    never = threading.Event()
    next_allocation(h, lambda job: never.wait(10) and None)
    h.tick()
    h.restored(3)
    h.steps(1)
    [rec] = h.incidents()
    assert rec["class"] == "admin"
    assert rec["evidence"]["requeue"]["error"] == NOT_ANSWERED
    never.set()


class _Counting(Listener):
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def on_incident(self, incident: Incident) -> None:
        self.seen.append(str(incident.cls))


def _wait_answered(h: Harness) -> None:
    unanswered = h.rec.app._unanswered
    assert unanswered is not None
    assert unanswered[0].wait(5)


def test_the_launchers_own_requeue_is_not_counted_twice(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.rec.on_time_limit(h.slot_members()[0], h.clock())
    h.tick()
    h.wait_slurm()
    asked: list[str] = []
    next_allocation(h, lambda job: asked.append(job))
    assert h.rec.app.outside_requeue is None and asked == []
    h.tick()
    h.restored(3)
    h.steps(1)
    assert [r["class"] for r in h.incidents()] == ["time_limit"]


def test_a_new_controller_in_the_same_allocation_records_nothing(tmp_path):
    h = Harness(tmp_path)
    h.start()
    next_allocation(h, lambda job: AllocationEnd("REQUEUED", 1.0, ()), restart_count=0)
    assert h.rec.app.outside_requeue is None


def test_status_says_why_until_the_next_allocations_first_step(tmp_path):
    from slurm_robust.launcher.submit.status import _pending

    h = Harness(tmp_path)
    h.start()
    next_allocation(h, lambda job: AllocationEnd("PREEMPTED", 1.0, ("n1",)))
    _joined(h)
    h.tick()
    said = _pending(h.rec.state.open_incident)
    assert said == ("requeued by Slurm: preempted for higher-priority work; the next "
                    "allocation goes on from step 3"), said


def test_workers_dying_of_slurms_sigterm_are_no_failure_while_it_ends_the_allocation(
        tmp_path):
    from slurm_robust.launcher.control.slurm_ending import HOLD_S
    from slurm_robust.launcher.control.state import load_state

    h = Harness(tmp_path)
    h.start()
    restarts, gen = h.rec.state.restarts, h.gen()
    first = h.slot_members()[0]
    signalled = h.clock()
    h.rec.on_ending(first, signalled)
    for m in h.slot_members():  # every worker died of it; one agent went silent
        h.fail(m, "worker_signal")
    h.tick(5.0)
    h.tick(30.0)
    assert h.incidents() == [] and h.slurm.calls == [] and h.gen() == gen
    assert h.rec.state.restarts == restarts
    assert load_state(RunPaths.of(h.cfg.run_dir).state).slurm_ending_at == signalled
    # Slurm requeued it: the next allocation's record starts at the SIGTERM.
    next_allocation(h, lambda job: AllocationEnd("REQUEUED", signalled + 5.0, ("n1",)))
    _joined(h)
    h.tick()
    h.restored(3)
    h.steps(1)
    [rec] = h.incidents()
    assert rec["class"] == "admin" and rec["fault_time"] == signalled
    assert rec["evidence"]["requeue"]["signalled_at"] == signalled
    assert h.rec.state.slurm_ending_at is None
    # An allocation that outlives the hold (a SIGTERM that ended nothing): handled.
    h2 = Harness(tmp_path / "outlived")
    h2.start()
    h2.rec.on_ending(h2.slot_members()[0], h2.clock())
    h2.fail(h2.slot_members()[0], "worker_signal")
    h2.tick(1.0)
    assert h2.rec.state.open_incident is None
    h2.tick(HOLD_S)
    h2.settle()
    assert h2.rec.state.open_incident is not None  # restarted in place after the hold


def test_the_report_carries_the_sigterm_time_only_once_set():
    from slurm_robust.launcher.messages import Report

    base = {"op": "report", "agent": 0, "node": "n1", "pid": 1, "key": "k", "time": 1.0}
    assert "ending" not in Report(**base).to_json()
    assert Report.from_json(Report(**base, ending=7.0).to_json()).ending == 7.0


def test_a_restart_in_place_that_slurms_requeue_cut_short_is_written_before_it(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.fail(h.slot_members()[0], "worker_signal")
    h.settle()
    assert h.rec.state.open_incident.rung == "in_place"
    next_allocation(h, lambda job: AllocationEnd("REQUEUED", h.clock(), ("n1",)))
    _joined(h)
    h.tick()
    h.restored(3)
    h.steps(1)
    first, second = h.incidents()
    assert (first["class"], first["rung"]) == ("worker_signal", "in_place")
    assert first["evidence"]["overlap"]["cut_short_by"] == second["incident"]
    assert (second["class"], second["rung"]) == ("admin", "requeue")
