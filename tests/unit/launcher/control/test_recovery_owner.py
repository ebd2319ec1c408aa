"""The recovery owner alone: a fake clock, scripted agent reports, no sockets, no processes.

Drives :class:`Recovery` through every rung of the ladder (in place, spare, requeue,
stop), a fault during a recovery, a hang's stack capture, and a requeue Slurm refuses.
The Slurm side is injected and recorded; the event log and state file are real files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.cadence import HURRY_POLL_S
from slurm_robust.launcher.control.recovery import (
    SETTLE_HEARD_S,
    SETTLE_S,
    Recovery,
    SlurmSide,
)
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.enums import Phase, PhaseError, Role, Rung
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import Progress, WorkerExit
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records
from slurm_robust.slurm import SlurmCommandError


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


@dataclass
class Member:
    index: int
    node: str
    addr: str = "127.0.0.1"
    last_seen: float = 1000.0
    lost: bool = False
    stacks: dict[str, Any] = field(default_factory=dict)
    states: dict[str, str | None] = field(default_factory=dict)


@dataclass
class SlurmRecorder:
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    refuse_requeue: bool = False

    def requeue(self, job_id: str, exclude: Any) -> None:
        self.calls.append(("requeue", job_id, sorted(exclude)))
        if self.refuse_requeue:
            raise SlurmCommandError(["scontrol", "requeue", job_id], 1, "denied")

    def drain(self, nodes: Any, reason: str) -> list[str]:
        self.calls.append(("drain", list(nodes)))
        return list(nodes)

    def verdict(self, paths: Any, job_id: str, node: str, reason: str, cls: str, *rest: Any
                ) -> None:
        self.calls.append(("verdict", node, cls))


class Harness:
    """A recovery owner with three members (two slots, one spare) on node n1..n3."""

    def __init__(self, tmp_path: Any, **cfg_kw: Any) -> None:
        kw: dict[str, Any] = {"nodes": 2, "spares": 1, "heartbeat_timeout_s": 2.0,
                              "hang_floor_s": 5.0, "startup_timeout_s": 5.0,
                              "fail_slow": False}
        kw.update(cfg_kw)
        self.cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"), **kw)
        self.clock = Clock()
        self.slurm = SlurmRecorder()
        self.members = {i: Member(i, f"n{i + 1}") for i in range(self.cfg.total_nodes)}
        ident = Identity(index=0, node="n1", job_id="42", step_key="42.0.0",
                         restart_count=0)
        self.rec = Recovery(self.cfg, ident, self.members, expected=self.cfg.total_nodes,
                            slurm=SlurmSide(requeue=self.slurm.requeue,
                                            drain=self.slurm.drain,
                                            verdict=self.slurm.verdict),
                            clock=self.clock)
        self.step = 0

    # --------------------------------------------------------------- scripted reports
    def tick(self, dt: float = 0.05) -> None:
        self.rec.tick(self.clock.advance(dt))

    def gen(self) -> int:
        assert self.rec.gen is not None
        return self.rec.gen.number

    def slot_members(self) -> list[Member]:
        assert self.rec.gen is not None
        return [self.members[i] for i in self.rec.gen.slots]

    def report(self, member: Member, progress: list[dict[str, Any]] = (),  # type: ignore[assignment]
               exits: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        member.last_seen = self.clock()
        self.rec.on_report(member, self.gen(), [Progress.from_json(p) for p in progress],
                           [WorkerExit.from_json(e) for e in exits], self.clock())

    def restored(self, step: int | None) -> None:
        for m in self.slot_members():
            for r in self.rec.ranks_of(m.index):
                self.report(m, [{"kind": "restored", "rank": r, "step": step,
                                 "tier": "memory" if step else None}])

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.step += 1
            t = self.clock.advance(0.1)
            for m in self.slot_members():
                for r in self.rec.ranks_of(m.index):
                    self.report(m, [{"kind": "step", "rank": r, "step": self.step,
                                     "loss": 1.0, "grad_norm": 1.0, "t": t}])
            self.tick(0.0)

    def fail(self, member: Member, cls: str, category: str = "explicit",
             signature: str | None = None) -> None:
        rank = self.rec.ranks_of(member.index)[0]
        self.report(member, exits=[{
            "rank": rank, "gen": self.gen(), "exit_code": 1, "signal": None,
            "time": self.clock(), "class": cls, "category": category, "secondary": False,
            "signature": signature, "line": f"{cls} here", "evidence": {}, "log": None}])

    def settle(self) -> None:
        self.tick(SETTLE_S + 0.05)
        self.wait_slurm()

    def wait_slurm(self) -> None:
        """Slurm actions run in threads: let them finish, then let recovery poll them."""
        for action in self.rec.actions:
            action.join(5)
        self.tick(0.0)

    def events(self) -> list[dict[str, Any]]:
        return read_records(RunPaths.of(self.cfg.run_dir).events).records

    def incidents(self) -> list[dict[str, Any]]:
        return [r for r in self.events() if r["event"] == "incident"]

    def start(self) -> None:
        self.tick()
        assert self.rec.phase is Phase.RUNNING
        self.restored(None)
        self.steps(3)


def test_gather_starts_a_generation_with_a_spare(tmp_path):
    h = Harness(tmp_path)
    third = h.members.pop(2)
    h.tick()
    assert h.rec.phase is Phase.GATHER  # two of three agents: wait for the third
    assert h.rec.plan_for(0) is None
    h.members[2] = third
    h.start()
    assert h.rec.gen.slots == [0, 1] and h.rec.spares == [2]
    assert h.rec.plan_for(0).role == Role.ACTIVE
    assert h.rec.plan_for(2).role == Role.SPARE
    h.rec.persist()
    assert load_state(RunPaths.of(h.cfg.run_dir).state).last_step == 3


def test_every_rung_in_turn(tmp_path):
    h = Harness(tmp_path)
    h.start()

    # in place: a worker crash, not blamed on its node
    assert h.rec.plan_for(0).poll_s is None  # steady state: the heartbeat
    h.fail(h.members[1], "worker_signal")
    h.tick(0.0)
    assert h.gen() == 1  # settling: waits for the other failures of the same moment
    # ... and tells every agent to report quickly, so that the settle ends once all have
    assert {h.rec.plan_for(i).poll_s for i in h.members} == {HURRY_POLL_S}
    token = h.rec.push_token()
    h.settle()
    assert h.gen() == 2 and h.rec.gen.slots == [0, 1] and h.rec.phase is Phase.RUNNING
    assert h.rec.push_token() != token  # the new plans: pushed
    assert h.rec.state.open_incident.to_json()["rung"] == Rung.IN_PLACE
    h.restored(3)
    h.steps(2)
    assert h.rec.state.open_incident is None
    inc = h.incidents()[-1]
    assert inc["rung"] == "in_place" and inc["restored_step"] == 3
    assert inc["recovered_at"] is not None and inc["class"] == "worker_signal"

    # spare: a node fault on n2 moves its slot to the parked n3
    h.fail(h.members[1], "gpu_memory_error")
    h.settle()
    assert h.rec.gen.slots == [0, 2] and h.rec.spares == []
    assert h.rec.plan_for(1).role == Role.EVICTED
    assert ("verdict", "n2", "gpu_memory_error") in h.slurm.calls
    h.restored(5)
    h.steps(1)
    assert h.incidents()[-1]["rung"] == "spare"

    # requeue: another node fault, no spare left
    h.fail(h.members[2], "gpu_unavailable")
    h.settle()
    assert h.rec.phase is Phase.REQUEUED
    assert ("requeue", "42", ["n2", "n3"]) in h.slurm.calls
    assert {h.rec.plan_for(i).role for i in h.members} == {Role.HOLD}
    assert h.rec.state.requeues == 1 and h.rec.state.open_incident.to_json()["rung"] == "requeue"
    h.tick()  # nothing happens while Slurm ends the allocation
    assert h.rec.phase is Phase.REQUEUED


def test_the_settle_ends_once_every_active_agent_has_reported_since(tmp_path):
    """Agents report an exit the moment it happens, so once each active agent has
    reported after the failure, an earlier one would be in: no need to wait SETTLE_S."""
    h = Harness(tmp_path)
    h.start()
    h.fail(h.members[1], "worker_signal")
    h.clock.advance(SETTLE_HEARD_S)
    h.report(h.members[1])  # the failed rank's agent, its next hurried report
    h.tick(0.0)
    assert h.gen() == 1  # n1 has not reported since the failure: still settling
    h.report(h.members[0])
    h.tick(0.0)  # the spare (n3) is not waited for
    assert h.gen() == 2 and h.rec.state.open_incident.to_json()["nodes"] == ["n2"]


def test_an_earlier_failure_reported_late_is_still_the_root(tmp_path):
    h = Harness(tmp_path)
    h.start()
    early = h.clock()
    h.clock.advance(0.01)
    h.fail(h.members[1], "worker_signal")
    h.clock.advance(SETTLE_HEARD_S)
    h.report(h.members[1])
    h.tick(0.0)
    assert h.gen() == 1
    # n1's agent was busy: its report of an exit before n2's comes now, and decides.
    h.report(h.members[0], exits=[{
        "rank": 0, "gen": h.gen(), "exit_code": None, "signal": 9, "time": early,
        "class": "worker_signal", "category": "explicit", "secondary": False,
        "signature": None, "line": "killed", "evidence": {}, "log": None}])
    h.tick(0.0)
    assert h.gen() == 2 and h.rec.state.open_incident.to_json()["nodes"] == ["n1"]


def test_a_silent_agent_holds_the_settle_to_its_full_time(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.fail(h.members[1], "worker_signal")
    for _ in range(4):
        h.clock.advance(HURRY_POLL_S)
        h.report(h.members[1])
        h.tick(0.0)
    assert h.gen() == 1  # n1 silent since the failure (0.2 s < SETTLE_S)
    h.tick(SETTLE_S)
    assert h.gen() == 2


def test_the_same_user_error_after_a_clean_restart_stops(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.fail(h.members[0], "user_code", signature="TypeError@train.py:3")
    h.settle()
    assert h.rec.phase is Phase.RUNNING and h.gen() == 2
    h.restored(3)
    h.steps(1)
    h.fail(h.members[0], "user_code", signature="TypeError@train.py:3")
    h.settle()
    assert h.rec.phase is Phase.DONE
    assert h.rec.result.status == "stopped"
    assert "same user-code error" in h.rec.result.verdict
    assert {h.rec.plan_for(i).role for i in h.members} == {Role.EXIT}
    assert h.incidents()[-1]["rung"] == "stop"
    assert load_state(RunPaths.of(h.cfg.run_dir).state).finished == "stopped"


def test_a_fault_during_recovery(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.fail(h.members[1], "worker_signal")
    h.settle()
    assert h.rec.state.open_incident is not None
    # before the restarted group finishes a step, n2's agent goes silent
    h.clock.advance(0.2)
    h.members[1].lost = True
    h.rec.on_agent_lost(h.members[1], closed=True, now=h.clock())
    h.settle()
    # the lost node is blamed at once: its slot goes to the spare
    assert h.rec.gen.slots == [0, 2] and h.gen() == 3
    # The unfinished first recovery rides with the second: both are written
    # once the run recovers from both, each naming the other.
    assert h.incidents() == []
    assert h.rec.state.open_incident.to_json()["class"] == "node_lost"
    assert h.rec.state.no_progress == 1  # the interrupted attempt made no step
    h.restored(3)
    h.steps(1)
    first, second = h.incidents()
    assert first["class"] == "worker_signal" and first["recovered_at"] is not None
    assert second["class"] == "node_lost" and second["rung"] == "spare"
    assert first["evidence"]["overlap"]["cut_short_by"] == second["incident"]


def test_a_hang_is_captured_then_restarted_in_place(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.tick(6.0)  # no step for longer than hang_floor_s
    assert h.rec.phase is Phase.DUMPING
    capture = h.rec.plan_for(0).stacks
    assert capture and h.rec.plan_for(1).stacks == capture
    h.members[0].stacks[capture] = {"ranks": [0]}
    h.members[1].states = {"1": "T"}  # a stopped worker is the plainest suspect
    h.members[1].stacks[capture] = {"ranks": [1]}
    h.tick()
    assert h.rec.phase is Phase.RUNNING and h.gen() == 2
    inc = h.rec.state.open_incident.to_json()
    assert inc["class"] == "job_hang" and inc["rung"] == "in_place"
    assert inc["ranks"] == [1] and inc["nodes"] == ["n2"]


def test_a_refused_requeue_ends_the_run(tmp_path):
    h = Harness(tmp_path, spares=0)
    h.slurm.refuse_requeue = True
    h.start()
    h.fail(h.members[1], "kernel_panic")
    h.settle()
    assert h.rec.phase is Phase.DONE
    assert h.rec.result.status == "failed"
    assert "requeue refused" in h.rec.result.verdict
    inc, = h.incidents()  # the incident that ended the run is in the event log
    assert inc["class"] == "kernel_panic" and inc["rung"] == "requeue"
    assert h.rec.state.open_incident is None


def test_the_phase_table_refuses_a_wrong_transition(tmp_path):
    h = Harness(tmp_path)
    with pytest.raises(PhaseError, match="gather -> dumping"):
        h.rec.app.enter(Phase.DUMPING)
    h.start()
    h.rec.finish("completed", None)
    assert h.rec.phase is Phase.DONE
    with pytest.raises(PhaseError, match="done -> running"):
        h.rec.app.enter(Phase.RUNNING)


def test_a_requeue_in_flight_never_blocks_the_tick(tmp_path):
    """slurmctld away during a requeue. The tick returns at once while the
    requeue waits in its thread; the run fails only when the requeue does."""
    import threading

    h = Harness(tmp_path, spares=0)
    release, entered = threading.Event(), threading.Event()

    def slow_requeue(job_id: str, exclude: Any) -> None:
        entered.set()
        release.wait(10)
        raise SlurmCommandError(["scontrol", "requeue", job_id], 1, "denied")

    h.rec.slurm.requeue = slow_requeue
    h.start()
    h.fail(h.members[1], "kernel_panic")
    h.tick(SETTLE_S + 0.05)
    assert entered.wait(5)
    for _ in range(5):
        h.tick()  # returns although the requeue is still blocked
    assert h.rec.phase is Phase.REQUEUED
    assert h.rec.plan_for(0).role == Role.HOLD
    release.set()
    h.wait_slurm()
    assert h.rec.phase is Phase.DONE and "denied" in h.rec.result.verdict


def test_losing_the_batch_node_marks_the_job_for_cancelling_at_its_end(tmp_path):
    # Slurm keeps a --no-kill job whose batch node died RUNNING: the run's end cancels it.
    h = Harness(tmp_path, spares=1)
    h.slurm.refuse_requeue = True  # so the run ends here, as a stop for shortfall would
    h.start()
    h.members[0].lost = True
    h.rec.on_agent_lost(h.members[0], closed=True, now=h.clock())
    h.settle()
    assert h.rec.state.blamed == ["n1"] and h.rec.batch_lost
    assert h.rec.phase is Phase.DONE


def test_losing_another_node_does_not(tmp_path):
    h = Harness(tmp_path, spares=1)
    h.start()
    h.members[1].lost = True
    h.rec.on_agent_lost(h.members[1], closed=True, now=h.clock())
    h.settle()
    assert h.rec.gen.slots == [0, 2] and not h.rec.batch_lost
