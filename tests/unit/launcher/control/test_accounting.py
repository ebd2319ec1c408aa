"""Accounting: the event log of a rehearsed run gives the report exact
``steps_redone`` / ``steps_lost`` and one incident per fault, whatever overlaps.

Each test drives the real recovery owner (the harness of test_recovery_owner: fake clock,
scripted agents, real event log), keeps the ground truth of which steps ran twice, and
checks the post-mortem report (slurm_robust.analysis) against it.
"""

from __future__ import annotations

from typing import Any

from slurm_robust.analysis.pipeline import analyse, load_inputs
from slurm_robust.launcher.enums import Phase

from .test_recovery_owner import Harness


class Truth:
    """Which steps finished, how often: a step that finished twice was redone."""

    def __init__(self) -> None:
        self.done: dict[int, int] = {}

    def steps(self, h: Harness, n: int) -> None:
        for _ in range(n):
            h.steps(1)
            self.done[h.step] = self.done.get(h.step, 0) + 1

    @property
    def redone(self) -> int:
        return sum(c - 1 for c in self.done.values())


def restore(h: Harness, step: int) -> None:
    h.restored(step)
    h.step = step  # the workers go on from the restored step


def report(h: Harness) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    a = analyse(load_inputs([h.cfg.run_dir]))
    return a.headline(), a.incidents.to_dict("records")


def test_attempt_start_precedes_the_first_step_so_nothing_extra_is_redone(tmp_path):
    h, truth = Harness(tmp_path), Truth()
    h.tick()
    h.restored(None)
    truth.steps(h, 6)
    h.fail(h.members[1], "worker_signal")
    h.settle()
    restore(h, 4)
    truth.steps(h, 5)
    h.fail(h.members[0], "worker_signal")
    h.settle()
    restore(h, 9)
    truth.steps(h, 2)
    starts = [e for e in h.events() if e["event"] in ("attempt_start", "step")]
    for i, e in enumerate(starts):
        if e["event"] == "attempt_start":
            later = [s for s in starts[i + 1:] if s["attempt"] == e["attempt"]]
            assert later and all(s["time"] >= e["time"] for s in later)
    head, incidents = report(h)
    assert truth.redone == 2 + 0  # steps 5, 6 ran twice; 10, 11 only once
    assert head["steps_redone"] == truth.redone
    assert [i["steps_lost"] for i in incidents] == [2, 0]


def test_the_last_step_before_a_fault_is_logged_even_when_sampled_out(tmp_path):
    h, truth = Harness(tmp_path, step_events_per_s=1.0), Truth()  # most steps sampled out
    h.tick()
    h.restored(None)
    truth.steps(h, 7)
    h.fail(h.members[1], "gpu_memory_error")  # a node fault: its slot goes to the spare
    h.settle()
    logged = [e["step"] for e in h.events() if e["event"] == "step"]
    assert logged[-1] == 7, logged
    restore(h, 5)
    truth.steps(h, 4)
    head, incidents = report(h)
    assert truth.redone == 2
    assert head["steps_redone"] == truth.redone
    assert incidents[0]["steps_lost"] == 2 and incidents[0]["last_step"] == 7


def test_a_fault_during_recovery_records_both_and_how_they_overlapped(tmp_path):
    h, truth = Harness(tmp_path), Truth()
    h.tick()
    h.restored(None)
    truth.steps(h, 5)
    h.fail(h.members[1], "worker_signal")
    h.settle()
    h.clock.advance(0.2)
    # before the restarted group finishes a step, n2's agent goes silent
    h.members[1].lost = True
    h.rec.on_agent_lost(h.members[1], closed=True, now=h.clock())
    h.settle()
    restore(h, 3)
    truth.steps(h, 4)
    first, second = h.incidents()
    assert first["class"] == "worker_signal" and second["class"] == "node_lost"
    # both recovered when the run did, and each names the other
    assert first["recovered_at"] == second["recovered_at"] is not None
    assert first["evidence"]["overlap"]["cut_short_by"] == second["incident"]
    assert second["evidence"]["overlap"]["cut_short"] == first["incident"]
    assert first["evidence"]["overlap"]["how"]
    head, incidents = report(h)
    assert truth.redone == 2  # steps 4 and 5
    assert head["steps_redone"] == truth.redone
    assert sum(i["steps_lost"] for i in incidents) == truth.redone
    assert head["incidents"] == 2 and head["mean_time_to_recover_s"] is not None
    assert all(i["time_to_recover"] >= 0 for i in incidents)


def test_times_are_never_negative_under_clock_skew(tmp_path):
    h = Harness(tmp_path)
    h.tick()
    h.restored(None)
    h.steps(3)
    rank = h.rec.ranks_of(1)[0]
    # the worker's clock runs 50 ms ahead of the controller's
    h.report(h.members[1], exits=[{
        "rank": rank, "gen": h.gen(), "exit_code": 1, "signal": None,
        "time": h.clock() + 0.05, "class": "worker_signal", "category": "explicit",
        "secondary": False, "signature": None, "line": "x", "evidence": {}, "log": None}])
    h.settle()
    restore(h, 3)
    h.steps(1)
    inc, = h.incidents()
    assert inc["fault_time"] <= inc["detected_at"] <= inc["localized_at"] <= \
        inc["recovered_at"]
    _, incidents = report(h)
    assert incidents[0]["time_to_detect"] >= 0


def test_the_incident_that_ends_a_run_reaches_the_log(tmp_path):
    h = Harness(tmp_path)
    h.slurm.refuse_requeue = True
    h.tick()
    h.restored(None)
    h.steps(2)
    h.fail(h.members[0], "gpu_unavailable")  # controller's own node: requeue
    h.settle()
    h.wait_slurm()
    assert h.rec.phase is Phase.DONE and h.rec.result.status == "failed"
    inc, = h.incidents()
    assert inc["rung"] == "requeue" and inc["class"] == "gpu_unavailable"
    assert [e["event"] for e in h.events()][-2:] == ["incident", "run_end"]


def test_an_incident_cut_short_by_a_stop_keeps_its_own_restore():
    # A NaN replay: the first incident restored step 14, the NaN came back before step 15
    # finished and the second incident stopped the run (no restore of its own).
    from slurm_robust.launcher.control import accounting
    from slurm_robust.launcher.messages import Incident

    first = Incident.from_json({
        "incident": "i1", "class": "nan", "category": "explicit", "fault_time": None,
        "detected_at": 1.0, "last_step": 14, "restored_step": 14, "restore_tier": "memory",
        "rung": "in_place", "evidence": {}})
    second = Incident.from_json({
        "incident": "i2", "class": "nan", "category": "explicit", "fault_time": None,
        "detected_at": 2.0, "last_step": 14, "restored_step": None, "restore_tier": None,
        "recovered_at": None, "rung": "stop", "steps_lost": 0, "evidence": {}})
    accounting.cut_short(first, second, 2.0)
    cut, = accounting.settle(second)
    assert (cut.restored_step, cut.restore_tier, cut.steps_lost) == (14, "memory", 0)
    assert cut.recovered_at is None and cut.evidence["overlap"]["cut_short_by"] == "i2"
