"""The NaN ladder's side of recovery: a NaN's origin and rung, the bitwise reference
test, and dual-phase replay (docs/ARCHITECTURE.md, phase ``replaying``).

:class:`NanRecovery` owns the NaN ladder, the pending bitwise request and the replay in
progress, and changes nothing else: what it wants done to the run (an incident through
the ladder, a replay phase's generation, a replay given up) it *returns* as an action
(actions.py), which the dispatcher hands to the run's applier (applier.py) like any
detector's. It reads the run through ``rec``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import actions as act
from slurm_robust.launcher.control import bitwise, replay
from slurm_robust.launcher.control.events import EventLog
from slurm_robust.launcher.control.generation import (
    Failure,
    Generation,
    Member,
    new_exits,
    restored_of,
)
from slurm_robust.launcher.control.ladder import Decision
from slurm_robust.launcher.control.nan_ladder import (
    NAN_SETTLE_S,
    NanLadder,
    NanResolution,
    attribute,
)
from slurm_robust.launcher.control.state import RunState
from slurm_robust.launcher.enums import IncidentClass, Phase, ProgressKind, Rung
from slurm_robust.launcher.messages import Incident, Progress, WorkerExit


class RunView(Protocol):
    """What this module reads of the run (the applier, applier.Applier). Only the
    incident counter is taken (incident_from_failure), as every detector does."""

    @property
    def cfg(self) -> RunConfig: ...

    @property
    def state(self) -> RunState: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def members(self) -> Mapping[int, Member]: ...

    @property
    def phase(self) -> Phase: ...

    def ranks_of(self, agent_index: int) -> list[int]: ...

    def incident_from_failure(self, gen: Generation, root: Failure,
                              detected: float) -> Incident: ...


log = logging.getLogger("slurm_robust.launcher.control.recovery")


class NanRecovery:
    """See the module docstring. Runs under the controller's lock, like its owner."""

    def __init__(self, rec: RunView, ladder: NanLadder) -> None:
        self.rec = rec
        self.nan = ladder
        self.bitwise_req: bitwise.BitwiseRequest | None = None
        self.replay: replay.ReplayRun | None = None

    def settling(self, gen: Generation, primary: list[Failure], now: float) -> bool:
        """Wait (up to NAN_SETTLE_S) until every active rank's anomaly line is in: the
        origin's may come in a later report than the first reporter's."""
        active = {r for i in gen.slots for r in self.rec.ranks_of(i)}
        first = min(f.seen for f in primary)
        return not active <= set(gen.anomalies) and now - first < NAN_SETTLE_S

    def handle(self, gen: Generation, root: Failure, detected: float,
               now: float) -> act.Action:
        """A NaN: name its origin, not the first reporter, and take the NaN ladder."""
        rank_nodes = [self.rec.members[i].node for i in gen.slots
                      for _ in range(self.rec.cfg.workers_per_node)]
        origin = attribute(gen.anomalies, rank_nodes)
        step = self.nan.decide(origin, now)
        # If the rollback's generation failed before finishing a step, its restore
        # itself happened: the incident this one cuts short records it.
        restored = restored_of(gen)
        incident = self.rec.incident_from_failure(gen, root, detected)
        reporters = sorted(gen.anomalies)
        incident.nodes, incident.ranks = sorted(set(origin.nodes)), list(origin.ranks)
        incident.evidence["nan"] = {**origin.to_json(), "resolution": step.resolution,
                                       "verdict": step.verdict, "reason": step.reason,
                                       "replay_s": step.replay_s,
                                       "first_reporter": {"rank": root.exit.rank,
                                                          "node": root.node},
                                       "reporting_ranks": reporters}
        override = Decision(Rung.STOP if step.resolution == "stop" else Rung.IN_PLACE,
                            step.reason)
        if step.resolution is NanResolution.REPLAY:
            return self._start_replay(gen, incident, restored, now)
        if step.verdict != "data_or_model":
            # The replaying attempt's ranks all run the reference step at their start:
            # milliseconds, so it is asked with the reattempt rather than after a second
            # failure; a node that computes it wrongly is faulty whatever the NaN was.
            self.bitwise_req = bitwise.request(self.rec.cfg.run_dir, self.rec.state.attempt + 1,
                                               incident, now)
            incident.evidence["nan"]["bitwise"] = {"requested": self.bitwise_req.id}
        # No node is blamed for a NaN here (nodes=[]): only a failed bitwise test may
        # evict one; no signature either, the NaN ladder replaces the repeat rule. A
        # skipped batch reaches the workers' skip file from the NaN listener.
        return act.Handle(gen, incident, None, [], override=override, restored=restored)

    def bitwise_tick(self, gen: Generation, now: float) -> act.Action | None:
        """Compare the bitwise digests once every active rank sent one (or the wait is
        over); a node that differs is evicted as the NaN incident's resolution."""
        req = self.bitwise_req
        if req is None or self.rec.phase is not Phase.RUNNING or gen.attempt < req.attempt:
            return None
        if gen.attempt > req.attempt:
            self.bitwise_req = None  # that attempt ended before answering
            return None
        active = {r for i in gen.slots for r in self.rec.ranks_of(i)}
        complete = active <= set(gen.bitwise)
        if not complete and now - req.asked_at < bitwise.BITWISE_WAIT_S:
            return None
        self.bitwise_req = None
        rank_nodes = [self.rec.members[i].node for i in gen.slots
                      for _ in range(self.rec.cfg.workers_per_node)]
        result = bitwise.compare({r: d for r, d in gen.bitwise.items() if r in active},
                                 rank_nodes)
        incident = req.incident
        nan_ev = incident.evidence["nan"]
        nan_ev["bitwise"] = {**nan_ev.get("bitwise", {}), **result.evidence,
                             "complete": complete, "seconds": round(now - req.asked_at, 3)}
        if result.passed:
            return None  # all agree: if the NaN moves again, dual-phase replay is next
        incident.evidence["nan"]["resolution"] = "evict"
        incident.localized_at = now
        reason = (f"bitwise reference test: {', '.join(result.differing)} differ(s) from "
                  f"the other nodes' digest {result.reference and result.reference[:16]}")
        # The NaN's own incident, resolved by eviction (a new one if it closed since).
        return act.Handle(gen, incident, None, list(result.differing), evict=reason,
                          revisits=True)

    # ------------------------------------------------------------------ replay
    def _start_replay(self, gen: Generation, incident: Incident,
                      restored: tuple[int | None, str | None], now: float) -> act.Action:
        """The NaN moved again after a rollback: dual-phase replay (control/replay.py)
        from the last step every rank snapshotted, over the steps the NaN appeared at.
        The rollback's incident, if it did not recover, is cut short by this one."""
        st = self.rec.state
        grid = replay.Grid.of(len(gen.slots))
        # Every rank finished (and snapshotted) the step before the NaN's: the memory
        # tier holds the last two, and the controller's count may lag behind them.
        nan_step = incident.evidence["nan"].get("step")
        restore = nan_step - 1 if isinstance(nan_step, int) and nan_step > 0 else \
            st.last_step
        until = replay.window(restore, self.nan.steps)
        rp = replay.ReplayRun(f"replay-{incident.incident}", grid, incident, gen,
                              restore, until, now)
        incident.evidence["nan"]["replay"] = {"restore_step": restore,
                                                 "until_step": until,
                                                 "grid": [grid.m, grid.n]}
        self.replay = rp
        log.warning("incident %s: dual-phase replay of steps %s..%s on a %sx%s grid",
                    incident.incident, (restore or 0) + 1, until, grid.m, grid.n)
        if grid.m == 1:  # one row is the whole job: it failed already, go by columns
            rp.outcomes[replay.ReplayPhase.HORIZONTAL.value] = {0: "implied"}
            return self._begin_replay_phase(replay.ReplayPhase.VERTICAL, now, restored)
        return self._begin_replay_phase(replay.ReplayPhase.HORIZONTAL, now, restored)

    def _begin_replay_phase(self, phase: replay.ReplayPhase, now: float,
                            starts: tuple[int | None, str | None] | None = None
                            ) -> act.BeginReplay:
        """A phase of the replay: its groups, each an attempt of its own (applier).
        ``starts``: the replay's first phase, with what the rollback restored."""
        rp = self.replay
        assert rp is not None
        rp.phase, rp.phase_started_at, rp.done = phase, now, {}
        rp.outcomes[phase.value] = {}
        return act.BeginReplay(rp, phase, rp.grid.groups(phase), first=starts is not None,
                               restored=starts)

    def on_replay_report(self, member: Member, gen: Generation,
                         progress: Sequence[Progress], exits: Sequence[WorkerExit]) -> None:
        """A replay's reports: a NaN fails the agent's group; steps are not the run's."""
        rp = self.replay
        if rp is None or member.index not in gen.slots:
            return
        group = rp.group_of(gen.slots.index(member.index))
        out = rp.outcomes[rp.phase.value]
        for item in progress:
            if item.kind is ProgressKind.ANOMALY and item.extra.get("what") == "nan":
                out[group] = "nan"
        for ex in new_exits(gen, member, exits):
            if ex.exit_code == 0:
                rp.done[member.index] = rp.done.get(member.index, 0) + 1
            elif ex.cls == IncidentClass.NAN:
                out[group] = "nan"
            elif out.get(group) != "nan":
                out[group] = "error"
                rp.details.append(f"{member.node} rank {ex.rank}: {ex.cls} ({ex.line})")

    def replay_tick(self, gen: Generation, now: float) -> act.Action | None:
        """Phase ``replaying``: the next phase, or the replay's end, once it settled."""
        rp = self.replay
        assert rp is not None
        if gen.failures:  # a lost agent: the ladder handles it, the replay is over
            return self._end_replay(None, "an agent was lost during the replay", now,
                                    lost=True)
        if not rp.settle(gen.slots, self.rec.cfg.workers_per_node, now):
            return None
        why = rp.inconclusive()
        if why is not None and rp.unanswered() and rp.phase.value not in rp.retried:
            # Once per phase: each retry costs a phase's time, and a group that errs
            # twice is a finding (the replay ends inconclusive and the ladder rolls back).
            rp.retried.append(rp.phase.value)
            log.warning("replay %s: %s; running the %s phase again", rp.id, why,
                        rp.phase.value)
            return self._begin_replay_phase(rp.phase, now)
        if why is not None:
            return self._end_replay(None, why, now)
        if rp.phase is replay.ReplayPhase.HORIZONTAL:
            return self._begin_replay_phase(replay.ReplayPhase.VERTICAL, now)
        h, v = replay.ReplayPhase.HORIZONTAL, replay.ReplayPhase.VERTICAL
        slot = rp.grid.locate(rp.failed(h), rp.failed(v))
        node = None if slot is None else self.rec.members[rp.origin_gen.slots[slot]].node
        return self._end_replay(node, f"row {rp.failed(h)} and column {rp.failed(v)} "
                                      f"reproduced the NaN", now)

    def _end_replay(self, node: str | None, why: str, now: float,
                    lost: bool = False) -> act.Action:
        """Evict the located node (spare or requeue), or roll back in place."""
        rp = self.replay
        assert rp is not None
        self.replay = None
        incident = rp.incident
        nan_ev = incident.evidence["nan"]
        nan_ev["replay"] = {**nan_ev.get("replay", {}),
                            **replay.evidence(rp.grid, rp.outcomes, node),
                            "reason": why, "errors": rp.details,
                            "retried": list(rp.retried),
                            "seconds": round(now - rp.started_at, 3)}
        log.warning("replay %s: %s -> %s", rp.id, why,
                    f"evicting {node}" if node else "inconclusive")
        if lost:
            nan_ev["resolution"] = NanResolution.ROLLBACK
            incident.rung = Rung.IN_PLACE
            return act.ReplayLost(incident)
        # The ladder goes on from the generation the NaN ended (its slots, its progress);
        # the run's generation stays the replay's, so the next plans' numbers keep
        # increasing.
        if node is None:
            nan_ev["resolution"] = NanResolution.ROLLBACK
            return act.Handle(rp.origin_gen, incident, None, [], override=Decision(
                Rung.IN_PLACE, f"dual-phase replay inconclusive ({why}): rolling back "
                               "again"))
        nan_ev["resolution"] = NanResolution.REPLAY
        incident.localized_at = now
        self.nan.on_evicted()
        return act.Handle(rp.origin_gen, incident, None, [node],
                          evict=f"dual-phase replay: {why}, crossing at {node}")
