"""The recovery owner: the run's phase, generation, plans and spares, and the ladder.

:class:`Recovery` is the only writer of the run's phase, its current
:class:`Generation`, the agents' plans, the spare list, the persisted run state
(``state.json``) and the event log. The controller (controller.py) keeps the TCP server
and the membership (which agents exist, when each was last heard) and calls in one
direction: reports (:meth:`Recovery.on_report`), lost agents
(:meth:`Recovery.on_agent_lost`) and the clock (:meth:`Recovery.tick`); it reads back
:meth:`Recovery.plan_for` to answer an agent. This module never imports the controller:
what it needs of an agent is the :class:`Member` protocol.

Every phase change goes through :meth:`Recovery._enter`, which checks it against
:data:`slurm_robust.launcher.enums.PHASE_TRANSITIONS` and raises PhaseError on a
transition the table does not allow (docs/ARCHITECTURE.md shows the table).

:meth:`Recovery.tick` runs the phase's handler; while running, detectors in priority
order (bitwise test, completion, failures, a due hot update, monitor findings, a hang
capture, a hang, fail-slow), and the first whose condition holds acts. The ladder itself
is pure (ladder.py): :meth:`Recovery._handle` gathers its facts, calls ``decide`` once
and :meth:`Recovery._apply` applies the whole answer: in place (a new generation on the
same slots), spare (the blamed node's slot goes to a parked agent), requeue
(``scontrol requeue``, through the injectable :class:`SlurmSide`, requeue_action.py),
stop (``run_end`` with a verdict). The NaN ladder's side (origin, bitwise test,
dual-phase replay) is nan_recovery.py; plans, a hang's incident and a stop-time
diagnosis's conclusion are built by pure helpers (plans.py, hang.py,
stop_diagnosis.py). Incidents follow docs/SCHEMAS.md: detected when the controller first
saw the failure, localized when the culprit was named, recovered when the first step
after the restored one finished.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import accounting, bitwise, blame, env_change, failslow, replay
from slurm_robust.launcher.control import monitor as node_monitor
from slurm_robust.launcher.control.events import EventLog, last_logged_step, new_incident
from slurm_robust.launcher.control.failover import StoodDown, Takeover
from slurm_robust.launcher.control.generation import (
    Failure,
    Generation,
    Member,
    PendingDiagnosis,
    new_exits,
    note_takeover,
    restored_of,
)
from slurm_robust.launcher.control.hang import capture_incident
from slurm_robust.launcher.control.hot_update import HotUpdate
from slurm_robust.launcher.control.ladder import Decision, Facts, decide
from slurm_robust.launcher.control.metrics import RunMetrics
from slurm_robust.launcher.control.nan_ladder import (
    NanLadder,
    NanPolicy,
)
from slurm_robust.launcher.control.nan_recovery import NanRecovery
from slurm_robust.launcher.control.outcome import RunOutcome
from slurm_robust.launcher.control.plans import PlanContext, generation_plans
from slurm_robust.launcher.control.policy import (
    UNLOCALISED_CLASSES,
    assign_slots,
    is_hung,
    made_progress,
)
from slurm_robust.launcher.control.requeue import (
    cancel_job,
    drain_directly,
    requeue_job,
    write_verdict,
)
from slurm_robust.launcher.control.requeue_action import PendingRequeue
from slurm_robust.launcher.control.shortfall import (
    Capacity,
    Choice,
    RequeuePlan,
    ShortfallPolicy,
    job_capacity,
    reserve_partition,
)
from slurm_robust.launcher.control.shortfall import evidence as shortfall_evidence
from slurm_robust.launcher.control.slurm_actions import SlurmAction
from slurm_robust.launcher.control.state import RunState, load_state, save_state
from slurm_robust.launcher.control.stop_diagnosis import (
    DIAGNOSIS_WAIT_S,
    conclude,
    diagnosed_before,
    wants_diagnosis,
)
from slurm_robust.launcher.enums import (
    Category,
    IncidentClass,
    Phase,
    ProgressKind,
    Role,
    Rung,
    RunStatus,
    check_transition,
)
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import (
    DiagnosisReport,
    Finding,
    Incident,
    NodeSample,
    Plan,
    Progress,
    WorkerExit,
)
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.run_dir_trust import ensure_run_dir
from slurm_robust.stacks.failslow import FailSlowDecision, FailSlowMonitor

log = logging.getLogger("slurm_robust.launcher.control.recovery")

#: Wait at most this long after the first primary failure for the others of the same
#: moment (the earliest is the root cause) ...
SETTLE_S = 0.3
#: ... or until every active agent has reported this long after it: agents report a
#: worker's exit the moment it happens (workers.wait_for_exit), so an earlier failure
#: would be in those reports. The margin covers clock skew between nodes (exit times are
#: the agents' clocks) and one hurried report interval.
SETTLE_HEARD_S = 0.05
#: Agents' report interval while a transition is imminent (see plan_for): 20 reports a
#: second per agent for the few tenths of a second a settle or a step boundary lasts.
HURRY_POLL_S = 0.05
#: Longest wait for stack captures on a hang before restarting anyway.
CAPTURE_BUDGET_S = 20.0
#: Longest wait for every agent of the allocation before starting with those present.
GATHER_TIMEOUT_S = 60.0


@dataclass
class SlurmSide:
    """The Slurm calls recovery makes, injectable so a test can record them.

    ``requeue`` and ``drain`` block (they wait out a slurmctld outage, see
    slurm_actions.py), so recovery runs them as :class:`SlurmAction` threads and polls
    them on its tick: the controller's lock is never held across a Slurm command."""

    requeue: Callable[..., None] = requeue_job
    drain: Callable[[Sequence[str], str], object] = drain_directly
    verdict: Callable[..., None] = write_verdict
    #: Counts what a requeue off the blamed nodes could get (shortfall.py); None: no
    #: count, the requeue goes ahead as asked. Recovery sets the real one by default.
    capacity: Callable[[str, Sequence[str]], Capacity | None] | None = None
    cancel: Callable[[str], None] = cancel_job


class Recovery:
    """See the module docstring. All methods run under the controller's lock."""

    def __init__(self, cfg: RunConfig, ident: Identity, members: Mapping[int, Member], *,
                 expected: int, slurm: SlurmSide | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.ident = ident
        self.members = members
        self.expected = expected
        self.slurm = slurm or SlurmSide(capacity=self._count_capacity)
        self.clock = clock
        self.paths = RunPaths.of(cfg.run_dir)
        # Every controller start (the first, a successor, a requeue's): the state and
        # versions it loads decide what the workers run (run_dir_trust.py).
        ensure_run_dir(self.paths.root)
        self.state: RunState = load_state(self.paths.state)
        self.events = EventLog(self.paths.events, self.state.run_id, ident.job_id,
                               max(self.state.attempt, 0), cfg.step_events_per_s)
        self._phase = Phase.GATHER
        self.gen: Generation | None = None
        self.gen_count = 0
        self.spares: list[int] = []
        self.evicted: set[int] = set()
        self._plan_map: dict[int, Plan] = {}
        #: Bumped on every change of a plan: the controller wakes the agents on it.
        self._plans_version = 0
        #: Diagnosis answers by (agent index, diagnosis id): only the asked agent counts.
        self.diagnoses: dict[tuple[int, str], DiagnosisReport] = {}
        self.failslow: FailSlowMonitor | None = None  # one per generation
        self.findings = node_monitor.NodeFindings(self.events)  # the in-job monitor
        self.step_times: list[float] = []
        self.last_step_time: float | None = None
        self.last_persist = 0.0
        self.result: RunOutcome | None = None
        self.done_at: float | None = None
        #: The batch step's node was lost: Slurm (22.05, ``--no-kill``) then keeps the job
        #: RUNNING after everything else ended ("batch step received ... This should
        #: never happen"), so a run that ends this way cancels its own job.
        self.batch_lost = False
        self.started_at = clock()
        # Live metrics (docs/METRICS.md), set by the controller once it serves them;
        # fed here because this owner is where steps, incidents and recoveries happen.
        self.metrics: RunMetrics | None = None
        #: Slurm actions started by this owner (in flight or finished), oldest first.
        self.actions: list[SlurmAction] = []
        self._requeue: PendingRequeue | None = None  # in flight
        # Failover (failover.py): this controller's term, the fence it checks
        # before writing the state, and what it took over (None: the first controller).
        self.term = 0
        self.superseded: Callable[[], bool] = lambda: False
        self.takeover: Takeover | None = None
        self.nans = NanRecovery(self, NanLadder.from_state(NanPolicy(cfg.nan_policy),
                                                           self.state.nan_ladder))
        #: Hot update: the code version the workers run, hot updates and rollbacks.
        self.hot = HotUpdate(cfg, self.events, clock)
        self._fingerprinted = False  # once per controller (env_change.py)

    # ------------------------------------------------------------------ read side
    @property
    def phase(self) -> Phase:
        return self._phase

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
        plan = self._plans.get(index)
        member = self.members.get(index)
        gen = self.gen
        if plan is None and gen is not None and member is not None and member.lost \
                and self._phase is not Phase.GATHER:
            plan = Plan(role=Role.EVICTED, gen=gen.number, attempt=gen.attempt)
        if plan is not None and self.term:
            plan = dataclasses.replace(plan, term=self.term)
        if plan is not None and self._transition_imminent():
            plan = dataclasses.replace(plan, poll_s=HURRY_POLL_S)
        return plan

    @property
    def _plans(self) -> dict[int, Plan]:
        return self._plan_map

    @_plans.setter
    def _plans(self, plans: dict[int, Plan]) -> None:
        self._plan_map = plans
        self._plans_version += 1

    def _set_plan(self, index: int, plan: Plan) -> None:
        self._plan_map[index] = plan
        self._plans_version += 1

    def wake_token(self) -> tuple[int, bool]:
        """Changes whenever some agent's plan does (a new set of plans, one changed, a
        transition turning imminent or over): the controller then wakes the agents, so
        each fetches its plan at once instead of at its next heartbeat."""
        return self._plans_version, self._transition_imminent()

    def decision_pending(self) -> bool:
        """Failures of the running generation wait for a decision (the tick makes it)."""
        gen = self.gen
        return self._phase is Phase.RUNNING and gen is not None and bool(gen.failures)

    def _transition_imminent(self) -> bool:
        """A new generation is likely within a moment: a failure is settling (the
        decision comes SETTLE_S after it), or a hot update waits for its step boundary.
        Agents then report every HURRY_POLL_S, so each sees the next plan (and the
        controller the boundary) within that instead of within a heartbeat."""
        gen = self.gen
        if self._phase is Phase.RUNNING and gen is not None and gen.failures:
            return True
        return self.hot.due_request is not None

    def ranks_of(self, agent_index: int) -> list[int]:
        gen = self.gen
        if gen is None or agent_index not in gen.slots:
            return []
        slot = gen.slots.index(agent_index)
        g = self.cfg.workers_per_node
        return list(range(slot * g, (slot + 1) * g))

    # ------------------------------------------------------------------ phase
    def _enter(self, new: Phase) -> None:
        check_transition(self._phase, new)
        self._phase = new

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
        if self._phase is Phase.REPLAYING:
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

    def on_findings(self, member: Member, findings: Sequence[Finding],
                    sample: NodeSample | None, now: float) -> None:
        """The in-job monitor: an agent's monitor findings and implicit sample."""
        gen = self.gen
        active = gen is not None and member.index in gen.slots and \
            self._phase in (Phase.RUNNING, Phase.DUMPING)
        self.findings.on_report(member.node, member.index, list(findings), sample, active,
                                now)

    def on_agent_lost(self, member: Member, closed: bool, now: float) -> None:
        """The controller stopped hearing from ``member``: a parked spare is dropped, an
        active slot becomes a ``node_lost`` failure of the current generation."""
        if member.index in self.spares:
            self.spares.remove(member.index)
            return
        gen = self.gen
        if gen is not None and member.index in gen.slots:
            lost = WorkerExit(
                rank=self.ranks_of(member.index)[0], gen=gen.number, exit_code=None,
                signal=None, time=member.last_seen, cls=IncidentClass.NODE_LOST,
                category=Category.EXPLICIT, line="agent heartbeat lost",
                evidence={"heartbeat_age_s": round(now - member.last_seen, 3),
                          "connection_closed": closed})
            gen.failures.append(Failure(lost, member.node, member.index, now))
            gen.first_failure_seen = gen.first_failure_seen or now

    def fail(self, reason: str) -> None:
        """A controller bug: end the run visibly (``failed``)."""
        self.finish(RunStatus.FAILED, reason)

    # ------------------------------------------------------------------ the tick
    def tick(self, now: float) -> None:
        """The clock: the current phase's handler (the phase table, docs/ARCHITECTURE.md)."""
        if self._phase is Phase.GATHER:
            self._gather(now)
            return
        if self._phase is Phase.REQUEUED:
            self._poll_requeue()
            return
        gen = self.gen
        if gen is None:
            return
        handler = {Phase.RUNNING: self._running_tick, Phase.DUMPING: self._running_tick,
                   Phase.DIAGNOSING: self._check_diagnosis,
                   Phase.REPLAYING: self.nans.replay_tick}.get(self._phase)
        if handler is not None:  # DONE: nothing more to do
            handler(gen, now)

    def _running_tick(self, gen: Generation, now: float) -> None:
        """Running (or capturing a hang's stacks): the first detector, in priority order,
        whose condition holds acts, and the tick ends there."""
        # While DIAGNOSING (its own handler) the others wait: exits of the stopped
        # generation are not new incidents.
        detectors = (self.nans.bitwise_tick,  # before a NaN of the faulty node
                     self._completion_tick,
                     # Before a pending capture: a crash or a lost node during the capture
                     # is the better-localized fault, and a lost agent cannot restart in
                     # place.
                     self._failures_tick,
                     self._hot_update_tick,
                     self._monitor_tick,
                     self._capture_tick,
                     self._hang_tick,
                     self._failslow_tick)
        for detector in detectors:
            if detector(gen, now):
                return

    def _completion_tick(self, gen: Generation, now: float) -> bool:
        active = {r for i in gen.slots for r in self.ranks_of(i)}
        if not (active and active <= gen.succeeded):
            return False
        self.finish(RunStatus.COMPLETED, None)
        return True

    def _failures_tick(self, gen: Generation, now: float) -> bool:
        if not gen.failures:
            return False
        self._maybe_handle_failures(gen, now)
        return True

    def _hot_update_tick(self, gen: Generation, now: float) -> bool:
        """A hot update due at a step boundary: a new generation in place."""
        if self._phase is not Phase.RUNNING or \
                not self.hot.tick(self.state.last_step, self._reports_steps(gen), now):
            return False
        self.hot.apply_due(self.state.last_step, now)
        self._begin_generation(gen.slots, now)
        return True

    def _capture_tick(self, gen: Generation, now: float) -> bool:
        if self._phase is not Phase.DUMPING:
            return False
        self._check_capture(gen, now)
        return True

    def _hang_tick(self, gen: Generation, now: float) -> bool:
        if not is_hung(gen.last_progress, now, self.step_times, self.cfg.hang_floor_s,
                       self.cfg.hang_factor, gen.steps_done > 0, self.cfg.startup_timeout_s,
                       self._reports_steps(gen)):
            return False
        self._start_hang_capture(gen, now)
        return True

    def _failslow_tick(self, gen: Generation, now: float) -> bool:
        decision = self.failslow.poll(now) if self.failslow is not None else None
        if decision is None:
            return False
        self._handle_fail_slow(gen, decision, now)
        return True

    def _gather(self, now: float) -> None:
        if self.state.finished:
            self.finish(self.state.finished, self.state.verdict, write=False)
            return
        if self.takeover is not None:
            self._gather_takeover(now)
            return
        live = [a for a in self.members.values() if not a.lost]
        self.state.given_nodes = sorted(set(self.state.given_nodes) | {a.node for a in live})
        waited = now - self.started_at
        if len(live) < self.expected and waited < GATHER_TIMEOUT_S:
            return
        usable = [a for a in sorted(live, key=lambda a: a.index)
                  if a.node not in self.state.blamed or waited > 5.0]
        try:
            slot_nodes, spare_nodes = assign_slots(self.state.slots,
                                                   [a.node for a in usable], self.cfg.nodes)
        except ValueError as exc:
            self.finish(RunStatus.FAILED, f"cannot start: {exc} (agents: "
                                          f"{sorted(a.node for a in live)})")
            return
        by_node = {a.node: a.index for a in usable}
        self.spares = [by_node[n] for n in spare_nodes]
        if self.state.attempt < 0:
            self.events.run_start(slot_nodes, spare_nodes, self.cfg.world_size,
                                  {"tp": 1, "pp": 1, "dp": self.cfg.world_size},
                                  self.cfg.to_dict())
        self._begin_generation([by_node[n] for n in slot_nodes], now)

    # ------------------------------------------------------------------ progress
    def _on_progress(self, gen: Generation, item: Progress, now: float) -> None:
        rank = item.rank
        if item.kind is ProgressKind.RESTORED:
            gen.restored[rank] = (item.step, item.tier)
        elif item.kind is ProgressKind.FINAL:
            gen.finals[rank] = item
        elif item.kind is ProgressKind.ANOMALY:
            gen.anomalies[rank] = {**item.extra, "step": item.step}
        elif item.kind is ProgressKind.BITWISE:
            req = self.bitwise_req
            if req is not None and item.extra.get("id") == req.id:
                gen.bitwise[rank] = str(item.extra.get("digest"))
        elif item.kind is ProgressKind.STEP and item.step is not None:
            step = item.step
            busy = failslow.busy_of({"busy_s": item.busy_s})
            if busy is not None and self.failslow is not None and 0 <= rank < \
                    self.cfg.world_size:
                self.failslow.record(rank, busy, now)
            gen.pending.setdefault(step, {})[rank] = item
            if len(gen.pending[step]) == self.cfg.world_size:
                self._on_step_complete(gen, step, gen.pending.pop(step), now)

    def _on_step_complete(self, gen: Generation, step: int, items: dict[int, Progress],
                          now: float) -> None:
        if not gen.announced:
            self._announce_attempt(gen)
        t_done = max(now if i.t is None else i.t for i in items.values())
        step_time = None
        if self.last_step_time is not None and gen.steps_done > 0:
            step_time = max(0.0, t_done - self.last_step_time)
            self.step_times.append(step_time)
            del self.step_times[:-64]
        self.last_step_time = t_done
        gen.steps_done += 1
        gen.last_progress = now
        losses = [i.loss for i in items.values() if i.loss is not None]
        norms = [i.grad_norm for i in items.values() if i.grad_norm is not None]
        loss = sum(losses) / len(losses) if losses else None
        grad_norm = max(norms) if norms else None
        self.state.last_step = step
        self.nan.on_step(step)
        if self.metrics is not None:
            self.metrics.on_step(step, step_time, t_done)
        opened = self.state.open_incident is not None
        self.events.step(step, step_time, loss, grad_norm, force=opened or gen.steps_done == 1,
                         now=t_done)
        if opened:
            self._resolve_open_incident(gen, step, now)
        self.hot.on_step(step, restored_of(gen), now)  # a hot update's downtime
        if now - self.last_persist > 1.0:
            self.persist()

    def persist(self) -> None:
        if self.superseded():
            # A successor claimed the next term while this controller was away: its
            # state.json must not be overwritten (the controller stands down).
            raise StoodDown(f"term {self.term} superseded")
        self.last_persist = self.clock()
        self.state.term = max(self.state.term, self.term)
        self.state.nan_ladder = self.nan.to_state()
        save_state(self.paths.state, self.state)

    # ------------------------------------------------------------------ takeover
    def _gather_takeover(self, now: float) -> None:
        """A successor (failover.py): wait briefly for the surviving agents, then rebuild
        the running generation from ``state.json`` and hand the lost agents to the
        ladder like any lost node (spare rung, or requeue without a spare)."""
        takeover = self.takeover
        assert takeover is not None
        live = [m for m in self.members.values() if not m.lost]
        waited = now - self.started_at
        if any(not getattr(m, "heard", True) for m in live) and \
                waited < self.cfg.heartbeat_timeout_s:
            return
        st = self.state
        by_node = {m.node: i for i, m in self.members.items()}
        unknown = [n for n in st.slots if n not in by_node]
        if unknown:
            self.finish(RunStatus.FAILED, f"takeover: slot node(s) {unknown} are not in "
                                          "the saved membership; cannot rebuild the run")
            return
        slots = [by_node[n] for n in st.slots]
        self.spares = [by_node[n] for n in st.spares
                       if n in by_node and not self.members[by_node[n]].lost]
        self.gen_count = st.gen
        gen = Generation(st.gen, st.attempt, slots, now)
        self.gen = gen
        self.events.attempt = max(st.attempt, 0)
        rank_nodes = [self.members[i].node for i in slots
                      for _ in range(self.cfg.workers_per_node)]
        self.failslow = failslow.new_monitor(self.cfg, rank_nodes)
        self.findings.new_generation(self.cfg, rank_nodes)  # the in-job monitor
        logged = last_logged_step(self.paths.events)
        st.last_step = max((s for s in (st.last_step, logged) if s is not None), default=None)
        # The old controller announced this attempt once a step finished; not again.
        gen.announced = st.last_step is not None
        self._plans = generation_plans(self._plan_context(), gen)
        self._enter(Phase.RUNNING)
        for member in self.members.values():
            if member.lost:
                self.on_agent_lost(member, False, now)
        note_takeover(gen, takeover)
        self.persist()
        log.warning("took over generation %s (attempt %s, term %s) on %s; lost %s",
                    gen.number, gen.attempt, self.term, st.slots,
                    sorted(m.node for m in self.members.values() if m.lost))

    # ------------------------------------------------------------------ generations
    def _begin_generation(self, slots: list[int], now: float) -> None:
        """Start a new generation of workers on ``slots`` (agent indices, one per slot)."""
        st = self.state
        if self.gen is not None or st.attempt >= 0:
            self.hot.on_restart(st.last_step, now)  # a staged hot update goes now
        self._fingerprint(now)
        st.attempt += 1
        self.events.attempt = st.attempt
        self.gen_count += 1
        gen = Generation(self.gen_count, st.attempt, list(slots), now)
        self.gen = gen
        st.slots = [self.members[i].node for i in slots]
        g = self.cfg.workers_per_node
        rank_nodes = [self.members[i].node for i in slots for _ in range(g)]
        self.failslow = failslow.new_monitor(self.cfg, rank_nodes)
        self.findings.new_generation(self.cfg, rank_nodes)  # the in-job monitor
        self._plans = generation_plans(self._plan_context(), gen)
        # What a successor needs (failover.py): the generation, membership and spares.
        st.gen = gen.number
        st.members = {str(i): m.node for i, m in self.members.items() if not m.lost}
        st.spares = [self.members[i].node for i in self.spares]
        self._enter(Phase.RUNNING)
        self.persist()
        log.info("generation %s (attempt %s) on %s, spares %s", gen.number, st.attempt,
                 st.slots, [self.members[i].node for i in self.spares])

    def _fingerprint(self, now: float) -> None:
        """The first generation of this controller compares the training
        command's files and packages with the last allocation's (env_change.py)."""
        if self._fingerprinted:
            return
        self._fingerprinted = True
        st = self.state
        command = self.hot.plan_fields().get("command") or list(self.cfg.command)
        try:
            fp = env_change.take(command)
        except (OSError, ValueError) as exc:  # a broken package's metadata, say
            log.warning("cannot fingerprint the training command: %s", exc)
            return
        what = env_change.changes(env_change.Fingerprint.from_dict(st.fingerprint), fp)
        st.fingerprint = fp.to_dict()
        if what:
            st.env_change = {"step": st.last_step, "attempt": st.attempt + 1,
                             "what": what, "time": now}
            log.warning("the training changed since the last allocation (%s): a user-side "
                        "failure or an exit with no named cause within %s steps is "
                        "counted as that change's",
                        "; ".join(what), env_change.WINDOW_STEPS)

    def _code_fields(self) -> dict[str, Any]:
        """The plans' code fields (hot update), with a change made outside `update` within
        its window counted as a recorded change too."""
        code = self.hot.plan_fields()
        ch = self.state.env_change
        if ch is not None and env_change.recent(ch, self.state.last_step):
            code = {**code, "code_change": True}
        return code

    def _plan_context(self) -> PlanContext:
        return PlanContext(self.cfg, self.ident.job_id, self.state.run_id, self.members,
                           tuple(self.spares), self._code_fields())

    def _announce_attempt(self, gen: Generation) -> None:
        """Write ``attempt_start`` once the ranks said what they restored (or stepped)."""
        gen.announced = True
        step, tier = restored_of(gen)
        # Stamped with the generation's start: it precedes the attempt's first step, so
        # that step is not counted as redone.
        self.events.attempt_start(list(self.state.slots), step, tier, now=gen.started_at)

    # ------------------------------------------------------------------ incidents
    def _maybe_handle_failures(self, gen: Generation, now: float) -> None:
        """Decide once the root cause is clear: the earliest primary failure once every
        active agent has reported since (at most a short settle time after it), or the
        earliest secondary one after a heartbeat timeout."""
        primary = [f for f in gen.failures if not f.exit.secondary]
        first_seen = gen.first_failure_seen or now
        if primary:
            first = min(f.seen for f in primary)
            if now - first < SETTLE_S and not self._all_heard_since(gen, first + SETTLE_HEARD_S):
                return
            root = min(primary, key=lambda f: f.exit.time)
        elif now - first_seen < self.cfg.heartbeat_timeout_s:
            return
        else:
            root = min(gen.failures, key=lambda f: f.exit.time)
        if root.exit.cls == IncidentClass.NAN:  # the NaN ladder
            if self.nans.settling(gen, primary, now):
                return
            self.nans.handle(gen, root, first_seen, now)
            return
        incident = self._incident_from_failure(gen, root, first_seen)
        # --- unclear side, nobody blamed -> stop-time diagnosis -----
        if self._wants_diagnosis(root):
            self._start_diagnosis(gen, root, incident, now)
            return
        repeat = diagnosed_before(root.exit.signature, self.state.diagnosis_passed)
        self._handle(gen, incident, root.exit.signature, [root.node], now,
                     diagnosed_repeat=repeat)

    def _all_heard_since(self, gen: Generation, t: float) -> bool:
        """Whether every agent of the generation's slots has reported at ``t`` or later
        (a lost one never has: the settle then runs its full time)."""
        for index in gen.slots:
            member = self.members.get(index)
            if member is None or member.lost or member.last_seen < t:
                return False
        return True

    def _incident_from_failure(self, gen: Generation, root: Failure,
                               detected: float) -> Incident:
        st = self.state
        st.incidents += 1
        ex = root.exit
        others = sorted({f.exit.rank for f in gen.failures if f is not root})
        evidence: dict[str, Any] = {k: v for k, v in (("exit_code", ex.exit_code),
                                                      ("signal", ex.signal), ("line", ex.line),
                                                      ("log", ex.log)) if v is not None}
        evidence.update(ex.evidence)
        if others:
            evidence["also_failed_ranks"] = others
        ch = st.env_change
        if ex.cls == IncidentClass.CODE_DATA_CHANGE and ch is not None and \
                env_change.recent(ch, st.last_step):
            # The change the classifier counted (made outside `update`): what changed,
            # and from which step, in the incident itself, not only in state.json.
            evidence["env_change"] = {k: ch[k] for k in ("step", "attempt", "what")
                                      if k in ch}
        return new_incident(f"i{st.incidents}", str(ex.cls), str(ex.category), detected,
                             fault_time=ex.time, nodes=[root.node], ranks=[ex.rank],
                             last_step=st.last_step, evidence=evidence)

    def _handle(self, gen: Generation, incident: Incident, signature: str | None,
                nodes: list[str], now: float, evict: str | None = None, *,
                diagnosed_repeat: bool = False, diagnosis_failed: bool = False,
                override: Decision | None = None) -> None:
        """Run the ladder for one incident and apply the decision. ``evict`` (a monitor's
        fatal finding of the in-job monitor): ``nodes`` are blamed whatever the class, and the text
        (the check and its evidence) goes into the decision's reason and the verdict.
        ``diagnosis_failed``: stop-time diagnosis failed ``nodes``, blamed the same way."""
        st = self.state
        self.events.flush_step()  # the last step before the fault is in the log
        if st.open_incident is not None:
            # The earlier recovery did not finish: both are kept and written together.
            accounting.cut_short(st.open_incident, incident, now)
            st.open_incident = None
        facts = self._ladder_facts(gen, incident, signature, nodes, now, evict,
                                   diagnosed_repeat, diagnosis_failed, override)
        self._apply(gen, incident, signature, decide(facts), evict, now)

    def _apply(self, gen: Generation, incident: Incident, signature: str | None,
               decision: Decision, evict: str | None, now: float) -> None:
        """Apply the ladder's decision: the run's counters and the incident, then the
        rung (stop; or a verdict and drain for each evicted node, and a new generation in
        place, on a spare, or a requeue)."""
        st = self.state
        if decision.batch_lost:
            self.batch_lost = True
        if decision.rollback is not None:
            # The new version's own failure: back to the previous one, restarted in place.
            self.hot.roll_back(decision.rollback, st.last_step, now)
            incident.evidence["rollback"] = decision.rollback
        if signature:
            st.signatures[signature] = st.signatures.get(signature, 0) + 1
        incident.rung = decision.rung
        incident.localized_at = incident.localized_at or now
        incident.nodes = sorted(set(incident.nodes) | set(decision.evict))
        incident.evidence["decision"] = decision.reason
        if self.metrics is not None:
            self.metrics.on_incident(incident)  # the rung is decided
        log.warning("incident %s: %s on %s -> %s (%s)", incident.incident,
                    incident.cls, incident.nodes, decision.rung, decision.reason)
        if decision.rung == Rung.STOP:
            self._write_incident(incident)
            self.finish(RunStatus.STOPPED, decision.reason)
            return
        st.restarts += 1
        # The verdict names the class and its evidence (flat, "pending deep check").
        reason = blame.verdict_reason(incident.cls, incident.evidence, evict)
        for node in decision.evict:
            self.slurm.verdict(self.paths, self.ident.job_id, node, reason,
                               incident.cls, incident.evidence, incident.incident,
                               self.cfg.site_config)
        if decision.evict and self.cfg.drain:
            evict_nodes = list(decision.evict)
            self._start_action("drain", lambda: self.slurm.drain(evict_nodes, reason))
        st.open_incident = incident
        if decision.rung == Rung.REQUEUE:
            self._start_requeue(decision)
        elif decision.rung == Rung.SPARE:
            self._begin_generation(self._replace(gen, decision), now)
        else:
            self._begin_generation(gen.slots, now)

    def _ladder_facts(self, gen: Generation, incident: Incident, signature: str | None,
                      nodes: list[str], now: float, evict: str | None,
                      diagnosed_repeat: bool, diagnosis_failed: bool,
                      override: Decision | None) -> Facts:
        """What the ladder needs for this incident. Counts it first: the run's attempts
        without progress and the named nodes' failures include this one."""
        st = self.state
        progressed = made_progress(gen.steps_done, self._reports_steps(gen),
                                   now - gen.started_at)
        st.no_progress = 0 if progressed else st.no_progress + 1
        cls = incident.cls
        if cls not in UNLOCALISED_CLASSES:
            for node in nodes:
                st.node_failures[node] = st.node_failures.get(node, 0) + 1
        return Facts(
            cls=cls, controller_node=self.ident.node, spares_left=len(self.spares),
            restarts=st.restarts, max_restarts=self.cfg.max_restarts, signature=signature,
            signature_seen=st.signatures.get(signature or "", 0),
            no_progress=st.no_progress, max_no_progress=self.cfg.max_no_progress,
            named=tuple(nodes), failures={n: st.node_failures.get(n, 0) for n in nodes},
            failures_to_blame=self.cfg.node_failures_to_blame,
            blame_named=bool(evict) or diagnosis_failed, diagnosed_repeat=diagnosed_repeat,
            batch_node=self._batch_node(), nan_advice=override, evict_reason=evict,
            rollback=self.hot.rollback_reason(cls),
            diagnosis_reason=(incident.evidence.get("diagnosis_reason")
                              if diagnosis_failed else None),
            blamed_before=tuple(st.blamed),
            max_blamed=self.cfg.max_blamed_nodes or self.cfg.total_nodes)

    def _batch_node(self) -> str | None:
        """The node of the batch step: agent 0's (Slurm starts the batch script and
        srun's task 0 on the allocation's first node). Its loss ends the job."""
        first = self.members.get(0)
        return first.node if first is not None else None

    def _replace(self, gen: Generation, decision: Decision) -> list[int]:
        slots = list(gen.slots)
        for node in decision.evict:
            for pos, index in enumerate(slots):
                if self.members[index].node == node:
                    slots[pos] = self.spares.pop(0)
                    self.evicted.add(index)
        self.state.blamed = sorted(set(self.state.blamed) | set(decision.evict))
        return slots

    def _start_requeue(self, decision: Decision) -> None:
        st = self.state
        st.requeues += 1
        st.blamed = sorted(set(st.blamed) | set(decision.evict))
        self.persist()
        gen_no = self.gen.number + 1 if self.gen else 1
        self._plans = {i: Plan(role=Role.HOLD, gen=gen_no, attempt=st.attempt)
                       for i in self.members}
        self._enter(Phase.REQUEUED)
        self._requeue = PendingRequeue(self._start_action, self.ident.job_id,
                                       list(st.blamed), self.slurm.capacity,
                                       self.slurm.requeue,
                                       ShortfallPolicy(self.cfg.on_shortfall), self.cfg.nodes)

    def _count_capacity(self, job_id: str, exclude: Sequence[str]) -> Capacity | None:
        return job_capacity(job_id, exclude, reserve_partition(self.cfg.site_config))

    def _start_action(self, name: str, call: Callable[[], object]) -> SlurmAction:
        action = SlurmAction(name, call, self.clock).start()
        self.actions.append(action)
        return action

    def _poll_requeue(self) -> None:
        """The requeue runs in its own thread; a refusal (after the retry budget, and
        after Slurm said the job was not requeued after all) ends the run."""
        pending = self._requeue
        done = pending.result() if pending is not None else None
        if done is None:
            return
        self._requeue = None
        if done.refused is not None:
            self.finish(RunStatus.FAILED, f"requeue refused by Slurm: {done.refused}")
            return
        cap, plan = done.capacity, done.plan
        if cap is not None and cap.short:
            self._note_shortfall(cap, plan)
        if plan.choice is Choice.STOP:
            self.state.requeues -= 1  # it never happened
            self.finish(RunStatus.STOPPED, plan.reason)
            return
        log.info("job %s requeued; holding until the allocation ends", self.ident.job_id)

    def _note_shortfall(self, cap: Capacity, plan: RequeuePlan) -> None:
        """The count goes into the open incident (its evidence, and ``status`` reads it
        while the job pends); a stop makes the incident's rung ``stop``."""
        log.warning("job %s: %s", self.ident.job_id, plan.reason)
        incident = self.state.open_incident
        if incident is None:
            return
        incident.evidence["shortfall"] = shortfall_evidence(cap, plan)
        if plan.choice is Choice.STOP:
            incident.rung = Rung.STOP
        self.persist()

    def _handle_fail_slow(self, gen: Generation, decision: FailSlowDecision,
                          now: float) -> None:
        """The fail-slow vote named a group: evict its node(s) through the ladder."""
        self.state.incidents += 1
        incident = failslow.incident_of(decision, f"i{self.state.incidents}",
                                        self.state.last_step, now,
                                        self.cfg.fail_slow_interval_s)
        self._handle(gen, incident, None, list(decision.eviction.nodes), now)

    def _monitor_tick(self, gen: Generation, now: float) -> bool:
        """The in-job monitor: a fatal finding of an active node evicts it through the
        ladder; the GPU-derived fail-slow vote and the idle-hang rule act like their
        script-fed counterparts. Returns whether it acted."""
        if self._phase is not Phase.RUNNING:
            return False
        pending = self.findings.take_fatal(set(gen.slots))
        if pending is not None:
            self.state.incidents += 1
            incident = node_monitor.incident_of(pending, f"i{self.state.incidents}",
                                                self.state.last_step,
                                                self.ranks_of(pending.agent), now)
            self._handle(gen, incident, None, [pending.node], now,
                         evict=node_monitor.verdict_reason(pending))
            return True
        mon = self.findings.gpu_failslow
        decision = mon.poll(now) if mon is not None else None
        if decision is not None:
            self._handle_fail_slow(gen, decision, now)
            return True
        if gen.steps_done == 0:
            timeout = self.cfg.hang_floor_s
            idle = self.findings.idle_hang([self.members[i].node for i in gen.slots],
                                           gen.last_progress, now, timeout)
            if idle is not None:
                log.warning("implicit hang: %s", idle)
                gen.hang_signal = idle
                self._start_hang_capture(gen, now)
                return True
        return False

    # ------------------------------------------------------------------ diagnosis
    # ByteRobust's stop-time diagnosis (EUD) before blaming a node for an
    # unclear crash. See docs/ARCHITECTURE.md, phase `diagnosing`.
    def _wants_diagnosis(self, root: Failure) -> bool:
        member = self.members.get(root.agent)
        can_answer = member is not None and not member.lost and root.agent not in self.spares
        return wants_diagnosis(root, self.state.node_failures,
                               self.cfg.node_failures_to_blame, self.state.diagnosis_passed,
                               can_answer)

    def _start_diagnosis(self, gen: Generation, root: Failure, incident: Incident,
                         now: float) -> None:
        """Ask the suspected node's agent to run diagnose(node); the others wait."""
        did = f"{incident.incident}-g{gen.number}"
        gen.diagnosis = PendingDiagnosis(did, root.agent, root.node, incident,
                                         root.exit.signature, now, now + DIAGNOSIS_WAIT_S)
        self._set_plan(root.agent, dataclasses.replace(self._plans[root.agent], diagnose=did))
        self._enter(Phase.DIAGNOSING)
        log.warning("incident %s: %s on %s has no clear side; diagnosing %s (%s)",
                    incident.incident, incident.cls, root.node, root.node, did)

    def _check_diagnosis(self, gen: Generation, now: float) -> None:
        pending = gen.diagnosis
        if pending is None:  # cannot happen: DIAGNOSING is only entered with one
            self.fail("recovery: diagnosing without a pending diagnosis")
            return
        member = self.members.get(pending.agent)
        lost = member is None or member.lost
        done = conclude(pending, self.diagnoses.get((pending.agent, pending.id)), lost, now)
        if done is None:
            return
        incident = pending.incident
        gen.diagnosis = None
        self._enter(Phase.RUNNING)
        incident.evidence.update(done.evidence)
        if done.localized_at is not None:
            incident.localized_at = done.localized_at
        if done.cleared:
            self.state.diagnosis_passed = sorted({*self.state.diagnosis_passed, done.cleared})
        self._handle(gen, incident, pending.signature, [pending.node], now,
                     diagnosis_failed=done.failed)

    # ------------------------------------------------------------------ hangs
    def _start_hang_capture(self, gen: Generation, now: float) -> None:
        """A hang: ask every active agent for a stack dump before anything is killed."""
        gen.capture = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-g{gen.number}"
        gen.capture_deadline = now + CAPTURE_BUDGET_S
        gen.hang_detected = now
        for index in gen.slots:
            self._set_plan(index, dataclasses.replace(self._plans[index], stacks=gen.capture))
        self._enter(Phase.DUMPING)
        log.warning("hang: no step for %.1f s; capturing stacks as %s",
                    now - gen.last_progress, gen.capture)

    def _check_capture(self, gen: Generation, now: float) -> None:
        """The capture is done once every live agent sent its stacks, or at its deadline;
        then the hang is an incident (restarted in place, the suspects named)."""
        views = [self.members[i] for i in gen.slots if not self.members[i].lost]
        done = [v for v in views if gen.capture in v.stacks]
        if len(done) < len(views) and now < gen.capture_deadline:
            return
        self.state.incidents += 1
        incident = capture_incident(f"i{self.state.incidents}", gen, views,
                                    self.paths.stacks, self.state.last_step, now)
        self._enter(Phase.RUNNING)
        self._handle(gen, incident, None, [], now)

    # ------------------------------------------------------------------ endings
    def _resolve_open_incident(self, gen: Generation, step: int, now: float) -> None:
        incident = self.state.open_incident
        restored, tier = restored_of(gen)
        if incident is None or (restored is not None and step <= restored):
            return
        last = incident.last_step
        if restored is not None and (last is None or restored > last):
            # A controller lost with its node may not have logged the newest finished
            # step, but the snapshot holds it: that step was done before the fault.
            last = restored
            incident.last_step = last
        incident.recovered_at, incident.restored_step = now, restored
        incident.restore_tier = tier
        incident.steps_lost = max(0, (last or 0) - (restored or 0))
        self._write_incident(incident)
        if self.metrics is not None:
            self.metrics.on_recovered(incident)
        self.state.open_incident = None
        self.persist()
        log.info("incident %s recovered in %.2f s (restored step %s from %s)",
                 incident.incident,
                 now - (incident.fault_time or incident.detected_at), restored, tier)

    def _reports_steps(self, gen: Generation) -> bool:
        """Whether this run reports steps at all (a plain script may never do)."""
        return self.state.last_step is not None or bool(gen.pending)

    def _close_on_completion(self, gen: Generation | None, now: float) -> None:
        """The run completed with an incident still open: no step after the restore was
        reported (a script that reports no steps). The restarted group finishing is the
        proof of recovery; ``recovered_at`` is when that group started (the best known
        bound) and ``steps_lost`` is null (unknown without step reports)."""
        incident = self.state.open_incident
        if incident is None:
            return
        restored, tier = restored_of(gen) if gen is not None else (None, None)
        incident.recovered_at = gen.started_at if gen is not None else now
        incident.restored_step, incident.restore_tier = restored, tier
        incident.steps_lost = None
        incident.evidence["recovery"] = ("closed at run completion: the restarted "
                                            "workers finished, no step report after the "
                                            "restore")
        self._write_incident(incident)
        self.state.open_incident = None

    def _write_incident(self, incident: Incident) -> None:
        if incident.rung is None:
            incident.rung = Rung.STOP
        for cut in accounting.settle(incident):  # incidents it cut short, first
            self.events.incident(accounting.ordered_times(cut))
        self.events.incident(accounting.ordered_times(incident))

    def finish(self, status: str, verdict: str | None, write: bool = True) -> None:
        """End the run: ``run_end``, state, and an exit plan for every agent."""
        if self._phase is Phase.DONE:
            return
        gen = self.gen
        final = gen.finals.get(0) if gen else None
        step = final.step if final is not None and final.step is not None \
            else self.state.last_step
        digest = final.params_sha256 if final is not None else None
        if write and status == RunStatus.COMPLETED and self.state.open_incident is not None:
            self._close_on_completion(gen, self.clock())
        if write:
            self.events.flush_step()
            if self.state.open_incident is not None:
                # The incident that ends a run (a refused requeue, a failure mid-recovery)
                # reaches the event log too, as it stood.
                self._write_incident(self.state.open_incident)
                self.state.open_incident = None
            self.events.run_end(status, step, digest, verdict)
            self.state.finished, self.state.verdict = status, verdict
            self.persist()
        # The snapshots are keyed by job id: a resubmission (new job) cannot use them, and
        # tmpfs pages are node memory, so every ending frees them (the durable tier stays).
        self._plans = {i: Plan(role=Role.EXIT, exit_code=0, purge=True) for i in self.members}
        self.result = RunOutcome(RunStatus(status), verdict, step, digest,
                                 self.state.attempt, self.state.restarts)
        self._enter(Phase.DONE)
        self.done_at = self.clock()
        log.info("run %s: %s%s", self.state.run_id, status, f" ({verdict})" if verdict else "")
