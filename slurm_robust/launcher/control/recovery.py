"""The recovery owner: a small dispatcher between the controller and the run's applier.

The controller (controller.py) keeps the TCP server and the membership (which agents
exist, when each was last heard) and calls in one direction: reports
(:meth:`Recovery.on_report`), lost agents (:meth:`Recovery.on_agent_lost`) and the clock
(:meth:`Recovery.tick`); it reads back :meth:`Recovery.plan_for` to answer an agent. This
module never imports the controller: what it needs of an agent is the :class:`Member`
protocol.

The pieces, each with one job:

- detectors.py: the running phase's detectors, in priority order (bitwise test,
  completion, failures, a due hot update, monitor findings, a hang capture, a hang,
  fail-slow), and the ``diagnosing`` phase's handler. Each reads the run and *returns* an
  action (actions.py); the first that returns one ends the tick.
- applier.py: the only writer of the run's phase, generation, plans, spares, state.json
  and event log. It applies an action, and with it the ladder's rungs: in place (a new
  generation on the same slots), spare (the blamed node's slot goes to a parked agent),
  requeue (``scontrol requeue`` through the injectable :class:`SlurmSide`), stop. The
  ladder itself is one pure function (ladder.py), its facts gathered by run_facts.py.
- listeners.py: the features that follow the run (live metrics, hot update, the NaN
  ladder's step count, the per-generation fail-slow vote and in-job monitor), called by
  the applier at a step, a generation, a decided or a recovered incident.
- nan_recovery.py: the ``replaying`` phase (dual-phase replay) and the NaN ladder's side.
- adopt.py: a successor controller's ``gather``, rebuilding the running generation.

Here: the inputs (reports, findings, lost agents) are recorded into the running
generation, and the tick runs the current phase's handler. Incidents follow
docs/SCHEMAS.md: detected when the controller first saw the failure, localized when the
culprit was named, recovered when the first step after the restored one finished.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import actions as act
from slurm_robust.launcher.control import adopt, bitwise, failslow, phases, replay
from slurm_robust.launcher.control import monitor as node_monitor
from slurm_robust.launcher.control.applier import CAPTURE_BUDGET_S, Applier, Fence, SlurmSide
from slurm_robust.launcher.control.cadence import hurry_poll_s, settle_hurry_helps
from slurm_robust.launcher.control.detectors import SETTLE_HEARD_S, SETTLE_S, Detectors
from slurm_robust.launcher.control.events import EventLog
from slurm_robust.launcher.control.failover import Takeover
from slurm_robust.launcher.control.generation import (
    Failure,
    Generation,
    Member,
    new_exits,
    note_takeover,
)
from slurm_robust.launcher.control.hot_update import HotUpdate
from slurm_robust.launcher.control.listeners import (
    HotUpdateListener,
    MetricsListener,
    MonitorListener,
    NanListener,
)
from slurm_robust.launcher.control.metrics import RunMetrics
from slurm_robust.launcher.control.nan_ladder import NanLadder, NanPolicy
from slurm_robust.launcher.control.nan_recovery import NanRecovery
from slurm_robust.launcher.control.outcome import RunOutcome
from slurm_robust.launcher.control.policy import assign_slots
from slurm_robust.launcher.control.requeue import requeue_job
from slurm_robust.launcher.control.shortfall import Capacity, job_capacity, reserve_partition
from slurm_robust.launcher.control.slurm_actions import SlurmAction
from slurm_robust.launcher.control.slurm_ending import SlurmEnding
from slurm_robust.launcher.control.state import RunState, load_state
from slurm_robust.launcher.control.time_limit import TimeLimitWatch, job_end_time
from slurm_robust.launcher.enums import (
    Category,
    IncidentClass,
    Phase,
    ProgressKind,
    Role,
    RunStatus,
)
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import (
    DiagnosisReport,
    Finding,
    NodeSample,
    Plan,
    Progress,
    WorkerExit,
)
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.run_dir_trust import ensure_run_dir

__all__ = ["CAPTURE_BUDGET_S", "GATHER_TIMEOUT_S", "SETTLE_HEARD_S", "SETTLE_S", "Fence",
           "Recovery", "SlurmSide"]

log = logging.getLogger("slurm_robust.launcher.control.recovery")

#: Longest wait for every agent of the allocation before starting with those present.
GATHER_TIMEOUT_S = 60.0


class Recovery:
    """See the module docstring. All methods run under the controller's lock.

    Collaborators come in through the constructor: the run's state and event log (a
    controller passes the ones it loaded; by default they are read from ``cfg.run_dir``),
    the Slurm side, the failover ``fence`` (term and supersession check), the ``takeover``
    a successor starts from, the live ``metrics`` (None: not kept), and ``elapsed(since,
    now)``: the seconds between two moments that count against the run's nodes (the
    controller's responsive time, overload.py; by default the wall time)."""

    def __init__(self, cfg: RunConfig, ident: Identity, members: Mapping[int, Member], *,
                 expected: int, slurm: SlurmSide | None = None,
                 clock: Callable[[], float] = time.time, state: RunState | None = None,
                 events: EventLog | None = None, fence: Fence | None = None,
                 takeover: Takeover | None = None,
                 metrics: RunMetrics | None = None,
                 elapsed: Callable[[float, float], float] | None = None) -> None:
        self.cfg, self.ident, self.members = cfg, ident, members
        self.expected, self.clock = expected, clock
        self.takeover, self.metrics = takeover, metrics
        self.paths = RunPaths.of(cfg.run_dir)
        # Every controller start (the first, a successor, a requeue's): the state and
        # versions it loads decide what the workers run (run_dir_trust.py).
        ensure_run_dir(self.paths.root)
        state = state if state is not None else load_state(self.paths.state)
        self.events = events or EventLog(self.paths.events, state.run_id, ident.job_id,
                                         max(state.attempt, 0), cfg.step_events_per_s)
        self.started_at = clock()
        #: Diagnosis answers by (agent index, diagnosis id): only the asked agent counts.
        self.diagnoses: dict[tuple[int, str], DiagnosisReport] = {}
        #: Hot update: the code version the workers run, hot updates and rollbacks.
        self.hot = HotUpdate(cfg, self.events, clock)
        self.findings = node_monitor.NodeFindings(self.events)  # the in-job monitor
        self.watch = MonitorListener(cfg, self.findings)
        listeners = [NanListener(lambda: self.nans.nan, cfg.run_dir),
                     *([MetricsListener(metrics)] if metrics is not None else []),
                     HotUpdateListener(self.hot), self.watch]
        self.app = Applier(cfg, ident, members, state, self.events, self.hot,
                           slurm or SlurmSide(requeue=partial(requeue_job,
                                                              site_config=cfg.site_config),
                                              capacity=self._count_capacity,
                                              end_time=job_end_time),
                           fence or Fence(), listeners, clock)
        self.nans = NanRecovery(self.app, NanLadder.from_state(NanPolicy(cfg.nan_policy),
                                                               state.nan_ladder))
        #: The time limit: Slurm's warning as the agents report it, and the job's end
        #: time read from Slurm (time_limit.py).
        side = self.app.slurm
        self.limit = TimeLimitWatch(cfg.warn_before_s, None if side.end_time is None else
                                    (lambda: side.end_time(ident.job_id)))
        self.detect = Detectors(self.app, self.hot, self.nans, self.watch, self.diagnoses,
                                self.limit, elapsed)
        #: Slurm ending the allocation (an agent's SIGTERM): no decisions meanwhile.
        self.ending = SlurmEnding()

    # ------------------------------------------------------------------ read side
    @property
    def phase(self) -> Phase:
        return self.app.phase

    @property
    def state(self) -> RunState:
        return self.app.state

    @property
    def gen(self) -> Generation | None:
        return self.app.gen

    @property
    def gen_count(self) -> int:
        return self.app.gen_count

    @property
    def spares(self) -> list[int]:
        return self.app.spares

    @property
    def evicted(self) -> set[int]:
        return self.app.evicted

    @property
    def slurm(self) -> SlurmSide:
        return self.app.slurm

    @property
    def actions(self) -> list[SlurmAction]:
        """Slurm actions started for this run (in flight or finished), oldest first."""
        return self.app.slurm_actions

    @property
    def batch_lost(self) -> bool:
        return self.app.batch_lost

    @property
    def done_at(self) -> float | None:
        return self.app.done_at

    @property
    def result(self) -> RunOutcome | None:
        return self.app.result

    @result.setter
    def result(self, outcome: RunOutcome) -> None:
        self.app.result = outcome  # a controller that stood down says so

    @property
    def failslow(self) -> failslow.FailSlowMonitor | None:
        return self.watch.failslow

    @property
    def nan(self) -> NanLadder:
        return self.nans.nan

    @property
    def bitwise_req(self) -> bitwise.BitwiseRequest | None:
        return self.nans.bitwise_req

    @property
    def replay(self) -> replay.ReplayRun | None:
        return self.nans.replay

    def plan_for(self, index: int) -> Plan | None:
        """The plan to send agent ``index`` (None: nothing yet), stamped with the term.

        An agent that was counted lost and reports again (a frozen process resumed, an
        old controller's own agent) is told it is evicted, so it stops its stale workers."""
        plan = self.app.plans.get(index)
        member = self.members.get(index)
        gen = self.gen
        if plan is None and gen is not None and member is not None and member.lost \
                and self.phase is not Phase.GATHER:
            plan = Plan(role=Role.EVICTED, gen=gen.number, attempt=gen.attempt)
        if plan is not None and self.app.fence.term:
            plan = dataclasses.replace(plan, term=self.app.fence.term)
        if plan is not None and self._hurried():
            plan = dataclasses.replace(plan, poll_s=hurry_poll_s(len(self.members),
                                                                 self.cfg.heartbeat_s))
        return plan

    def push_token(self) -> tuple[int, bool]:
        """Changes whenever some agent's plan does (a new set of plans, one changed, a
        hurry starting or over): the controller then pushes the agents their plans, so
        each has its plan at once instead of at its next heartbeat."""
        return self.app.plans_version, self._hurried()

    def decision_pending(self) -> bool:
        """Failures of the running generation wait for a decision (the tick makes it)."""
        gen = self.gen
        return self.phase is Phase.RUNNING and gen is not None and bool(gen.failures) \
            and self.app.backoff is None

    def _hurried(self) -> bool:
        """The agents report every hurried poll (cadence.py) instead of every heartbeat:
        while a hot update waits for its step boundary, which only their progress
        reports show, and while a failure settles in a run small enough that their
        reports end the settle early (cadence.settle_hurry_helps: every agent heard
        since the failure, detectors.py).

        Past that size the hurry cannot end the settle before SETTLE_S, and its decision
        is pushed to every agent the moment it is made: at 4,096 agents the hurry only
        asked for 2,000 reports a second while the decision was being pushed, and the
        pushes queued behind them (bench scale)."""
        if self.hot.due_request is not None:
            return True
        return self.decision_pending() and settle_hurry_helps(len(self.members),
                                                              self.cfg.heartbeat_s, SETTLE_S)

    def ranks_of(self, agent_index: int) -> list[int]:
        return self.app.ranks_of(agent_index)

    # ------------------------------------------------------------------ input
    def on_report(self, member: Member, gen_number: int, progress: Sequence[Progress],
                  exits: Sequence[WorkerExit], now: float,
                  diagnoses: Sequence[DiagnosisReport] = ()) -> None:
        """An agent's report: its step progress and worker exits (current generation),
        and the stop-time diagnoses it ran."""
        for d in diagnoses:
            if d.node == member.node:  # an agent answers for its own node only
                self.diagnoses.setdefault((member.index, d.id), d)
        gen = self.gen
        if gen is None or gen_number != gen.number:
            return
        if self.phase is Phase.REPLAYING:
            self.nans.on_replay_report(member, gen, progress, exits)
            return
        for item in progress:
            self._on_progress(gen, item, now)
        for ex in new_exits(gen, member, exits):
            if ex.exit_code == 0:
                gen.succeeded.add(ex.rank)
            else:
                gen.failures.append(Failure(ex, member.node, member.index, now))
                gen.first_failure_seen = gen.first_failure_seen or now

    def on_time_limit(self, member: Member, warned_at: float) -> None:
        """An agent got Slurm's warning before the time limit (its report says when)."""
        self.limit.note(member.node, warned_at)

    def on_ending(self, member: Member, at: float) -> None:
        """An agent got SIGTERM: Slurm is ending the allocation (slurm_ending.py). The
        first one is kept in state.json for the next allocation's record of it."""
        if self.ending.note(member.node, at) and self.phase is not Phase.DONE:
            self.state.slurm_ending_at = at
            self.app.persist()

    def on_findings(self, member: Member, findings: Sequence[Finding],
                    sample: NodeSample | None, now: float) -> None:
        """The in-job monitor: an agent's monitor findings and implicit sample."""
        gen = self.gen
        active = gen is not None and gen.slot_of(member.index) is not None and \
            self.phase in (Phase.RUNNING, Phase.DUMPING)
        self.findings.on_report(member.node, member.index, list(findings), sample, active,
                                now)

    def on_agent_lost(self, member: Member, closed: bool, now: float) -> None:
        """The controller stopped hearing from ``member``: a parked spare is dropped, an
        active slot becomes a ``node_lost`` failure of the current generation."""
        if member.index in self.spares:
            self.spares.remove(member.index)
            return
        gen = self.gen
        if gen is not None and gen.slot_of(member.index) is not None:
            lost = WorkerExit(
                rank=self.ranks_of(member.index)[0], gen=gen.number, exit_code=None,
                signal=None, time=member.last_seen, cls=IncidentClass.NODE_LOST,
                category=Category.EXPLICIT, line="agent heartbeat lost",
                evidence={"heartbeat_age_s": round(now - member.last_seen, 3),
                          "connection_closed": closed})
            gen.failures.append(Failure(lost, member.node, member.index, now))
            gen.first_failure_seen = gen.first_failure_seen or now

    def _on_progress(self, gen: Generation, item: Progress, now: float) -> None:
        """One progress line into the running generation; a step every rank finished
        goes to the applier."""
        rank = item.rank
        if item.kind is ProgressKind.RESTORED:
            gen.restored[rank] = (item.step, item.tier)
        elif item.kind is ProgressKind.FINAL:
            gen.finals[rank] = item
        elif item.kind is ProgressKind.FINISHING:
            gen.finishing.add(rank)
            gen.last_progress = max(gen.last_progress, now)
        elif item.kind is ProgressKind.PHASE:
            self.state.declares_phases = True
            phases.on_phase_line(gen, item, now, self.state.phase_times)
        elif item.kind is ProgressKind.ANOMALY:
            gen.anomalies[rank] = {**item.extra, "step": item.step}
        elif item.kind is ProgressKind.BITWISE:
            req = self.bitwise_req
            if req is not None and item.extra.get("id") == req.id:
                gen.bitwise[rank] = str(item.extra.get("digest"))
        elif item.kind is ProgressKind.STEP and item.step is not None:
            step = item.step
            busy = failslow.busy_of(item.busy_s)
            mon = self.watch.failslow
            if busy is not None and mon is not None and 0 <= rank < self.cfg.world_size:
                mon.record(rank, busy, now)
            gen.pending.setdefault(step, {})[rank] = item
            if len(gen.pending[step]) == self.cfg.world_size:
                self.app.step_done(gen, step, gen.pending.pop(step), now)

    # ------------------------------------------------------------------ the tick
    def tick(self, now: float) -> None:
        """The clock: the current phase's handler (the phase table, docs/ARCHITECTURE.md)."""
        phase = self.phase
        if phase is Phase.GATHER:
            self._apply(self._gather(now), now)
            return
        self.app.settle_outside_requeue()
        if phase is Phase.REQUEUED:
            self.app.poll_requeue()
            return
        if self.app.backoff is not None and phase is Phase.RUNNING:
            # A restart held back by an outage's backoff: only its end or Slurm's time
            # limit is decided meanwhile.
            if not self.ending.holds(now):
                self._apply(self.detect.backing_off(self.app.backoff, self.gen, now), now)
            return
        gen = self.gen
        if gen is None or self.ending.holds(now):
            return  # Slurm is ending the allocation: its workers' deaths are no failure
        if phase in (Phase.RUNNING, Phase.DUMPING):
            # While DIAGNOSING (its own handler) the others wait: exits of the stopped
            # generation are not new incidents.
            for detector in self.detect.running():
                action = detector(gen, now)
                if action is not None:
                    self._apply(action, now)
                    return
        elif phase is Phase.DIAGNOSING:
            self._apply(self.detect.diagnosing(gen, now), now)
        elif phase is Phase.REPLAYING:
            self._apply(self.nans.replay_tick(gen, now), now)
        # DONE: nothing more to do

    def _apply(self, action: act.Action | None, now: float) -> None:
        if action is not None:
            self.app.apply(action, now)

    def _gather(self, now: float) -> act.Action | None:
        """Phase ``gather``: wait for the allocation's agents, then place the run."""
        st = self.state
        if st.finished:
            self.app.finish(st.finished, st.verdict, write=False)
            return None
        if self.takeover is not None:
            return self._take_over(self.takeover, now)
        live = [a for a in self.members.values() if not a.lost]
        self.app.note_given([a.node for a in live])
        waited = now - self.started_at
        if len(live) < self.expected and waited < GATHER_TIMEOUT_S:
            return None
        usable = [a for a in sorted(live, key=lambda a: a.index)
                  if a.node not in st.blamed or waited > 5.0]
        try:
            slot_nodes, spare_nodes = assign_slots(st.slots, [a.node for a in usable],
                                                   self.cfg.nodes)
        except ValueError as exc:
            return act.Finish(RunStatus.FAILED, f"cannot start: {exc} (agents: "
                                                f"{sorted(a.node for a in live)})")
        by_node = {a.node: a.index for a in usable}
        return act.Start([by_node[n] for n in slot_nodes], [by_node[n] for n in spare_nodes],
                         slot_nodes, spare_nodes)

    def _take_over(self, takeover: Takeover, now: float) -> act.Action | None:
        """A successor (failover.py): wait briefly for the surviving agents, then adopt
        the running generation from ``state.json``; the lost agents go to the ladder."""
        if not adopt.ready(self.members, now - self.started_at,
                           self.cfg.heartbeat_timeout_s):
            return None
        rebuilt = adopt.rebuild(self.state, self.members, now)
        if isinstance(rebuilt, str):
            return act.Finish(RunStatus.FAILED, rebuilt)
        gen, spares = rebuilt
        self.app.adopt_generation(gen, spares, now)
        for member in self.members.values():
            if member.lost:
                self.on_agent_lost(member, False, now)
        note_takeover(gen, takeover)
        self.app.persist()
        log.warning("took over generation %s (attempt %s, term %s) on %s; lost %s",
                    gen.number, gen.attempt, self.app.fence.term, self.state.slots,
                    sorted(m.node for m in self.members.values() if m.lost))
        return None

    # ------------------------------------------------------------------ endings, state
    def persist(self) -> None:
        self.app.persist()

    def finish(self, status: str, verdict: str | None, write: bool = True) -> None:
        """End the run: ``run_end``, state, and an exit plan for every agent."""
        self.app.finish(status, verdict, write)

    def fail(self, reason: str) -> None:
        """A controller bug: end the run visibly (``failed``)."""
        self.app.finish(RunStatus.FAILED, reason)

    def _count_capacity(self, job_id: str, exclude: Sequence[str]) -> Capacity | None:
        return job_capacity(job_id, exclude, reserve_partition(self.cfg.site_config))
