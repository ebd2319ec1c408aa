"""The one writer of a run's state: phase, generation, plans, spares, state.json, events.

Detectors and phase handlers (detectors.py) read the run and return an action
(actions.py); :meth:`Applier.apply` carries it out. The rungs are applied here and
nowhere else: a new generation (in place, or with the blamed node's slot given to a parked
spare), a requeue (``scontrol requeue``, through the injectable :class:`SlurmSide`, in a
:class:`SlurmAction` thread polled on the tick), or a stop (``run_end`` with a verdict).
Features follow through :class:`~slurm_robust.launcher.control.listeners.Listener` hooks,
called from here once per moment (a step, a generation, a decided or recovered incident).

Every phase change goes through :meth:`Applier.enter`, which checks it against
:data:`slurm_robust.launcher.enums.PHASE_TRANSITIONS` and raises PhaseError on a
transition the table does not allow (docs/ARCHITECTURE.md shows the table).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import accounting, blame, env_change, phases
from slurm_robust.launcher.control import actions as act
from slurm_robust.launcher.control.events import EventLog, last_logged_step
from slurm_robust.launcher.control.external_requeue import (
    AllocationEnd,
    PreviousEndProbe,
    read_previous_end,
    requeued_outside,
)
from slurm_robust.launcher.control.failover import StoodDown
from slurm_robust.launcher.control.generation import (
    Failure,
    Generation,
    Member,
    PendingDiagnosis,
    restored_of,
)
from slurm_robust.launcher.control.hot_update import HotUpdate
from slurm_robust.launcher.control.ladder import Decision, Facts, decide
from slurm_robust.launcher.control.listeners import Listener
from slurm_robust.launcher.control.outage import OUTAGE_CLASSES, Backoff
from slurm_robust.launcher.control.outcome import RunOutcome
from slurm_robust.launcher.control.plans import PlanContext, generation_plans, replay_plans
from slurm_robust.launcher.control.requeue import (
    cancel_job,
    drain_directly,
    requeue_job,
    write_verdict,
)
from slurm_robust.launcher.control.requeue_action import PendingRequeue
from slurm_robust.launcher.control.run_facts import end_outage, failure_incident, ladder_facts
from slurm_robust.launcher.control.shortfall import (
    Capacity,
    Choice,
    RequeuePlan,
    ShortfallPolicy,
)
from slurm_robust.launcher.control.shortfall import evidence as shortfall_evidence
from slurm_robust.launcher.control.slurm_actions import SlurmAction
from slurm_robust.launcher.control.state import RunState, save_state
from slurm_robust.launcher.control.stop_diagnosis import DIAGNOSIS_WAIT_S
from slurm_robust.launcher.enums import (
    IncidentClass,
    Phase,
    Role,
    Rung,
    RunStatus,
    check_transition,
)
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import Incident, Plan, Progress
from slurm_robust.launcher.paths import RunPaths

log = logging.getLogger("slurm_robust.launcher.control.recovery")

#: Longest wait for stack captures on a hang before restarting anyway.
CAPTURE_BUDGET_S = 20.0


@dataclass
class SlurmSide:
    """The Slurm calls recovery makes, injectable so a test can record them.

    ``requeue`` and ``drain`` block (they wait out a slurmctld outage, see
    slurm_actions.py), so the applier runs them as :class:`SlurmAction` threads and polls
    them on its tick: the controller's lock is never held across a Slurm command."""

    requeue: Callable[..., None] = requeue_job
    drain: Callable[[Sequence[str], str], object] = drain_directly
    verdict: Callable[..., None] = write_verdict
    #: Counts what a requeue off the blamed nodes could get (shortfall.py); None: no
    #: count, the requeue goes ahead as asked. Recovery sets the real one by default.
    capacity: Callable[[str, Sequence[str]], Capacity | None] | None = None
    cancel: Callable[[str], None] = cancel_job
    #: The job's end time (Unix seconds; None: unlimited or unknown); None: no clock, the
    #: time limit is acted on at Slurm's signal only. Recovery sets the real one by default.
    end_time: Callable[[str], float | None] | None = None
    #: How the job's previous allocation ended (sacct), read when this allocation
    #: follows a requeue the launcher did not make (external_requeue.py).
    previous_end: Callable[[str], AllocationEnd | None] = read_previous_end


@dataclass
class Fence:
    """Failover (failover.py): this controller's term, and the check that a successor
    has not claimed a newer one (then state.json is no longer this controller's)."""

    term: int = 0
    superseded: Callable[[], bool] = lambda: False


class Applier:
    """See the module docstring. All methods run under the controller's lock."""

    def __init__(self, cfg: RunConfig, ident: Identity, members: Mapping[int, Member],
                 state: RunState, events: EventLog, hot: HotUpdate, slurm: SlurmSide,
                 fence: Fence, listeners: Sequence[Listener],
                 clock: Callable[[], float]) -> None:
        self.cfg, self.ident, self.members = cfg, ident, members
        self.state, self.events, self.hot, self.slurm = state, events, hot, slurm
        self.fence, self.listeners, self.clock = fence, list(listeners), clock
        self.paths = RunPaths.of(cfg.run_dir)
        self.phase = Phase.GATHER
        self.gen: Generation | None = None
        self.gen_count = 0
        self.spares: list[int] = []
        self.evicted: set[int] = set()
        self._plan_map: dict[int, Plan] = {}
        #: Bumped on every change of a plan: the controller wakes the agents on it.
        self.plans_version = 0
        self.step_times: list[float] = []
        self.last_step_time: float | None = None
        self.last_persist = 0.0
        self.result: RunOutcome | None = None
        self.done_at: float | None = None
        #: The batch step's node was lost: Slurm (22.05, ``--no-kill``) then keeps the job
        #: RUNNING after everything else ended ("batch step received ... This should
        #: never happen"), so a run that ends this way cancels its own job.
        self.batch_lost = False
        #: Slurm actions started here (in flight or finished), oldest first.
        self.slurm_actions: list[SlurmAction] = []
        self._requeue: PendingRequeue | None = None  # in flight
        #: A restart held back until its backoff ends (None: none).
        self.backoff: Backoff | None = None
        self._fingerprinted = False  # once per controller (env_change.py)
        #: A requeue the launcher did not make (an admin's, a preemption): its cause is
        #: read from accounting in a thread from now on, and recorded at start_run.
        self.outside_requeue: PreviousEndProbe | None = None
        #: Its incident, opened before accounting answered: it takes the cause when the
        #: answer comes (settle_outside_requeue, every tick) or, at the latest, when written.
        self._unanswered: tuple[PreviousEndProbe, Incident] | None = None
        if requeued_outside(ident.restart_count, state.restart_count, state.open_incident,
                            state.finished):
            self.outside_requeue = PreviousEndProbe(ident.job_id, slurm.previous_end,
                                                    ident.restart_count,
                                                    int(state.restart_count or 0))

    # ------------------------------------------------------------------ plans, phase
    @property
    def plans(self) -> dict[int, Plan]:
        return self._plan_map

    @plans.setter
    def plans(self, plans: dict[int, Plan]) -> None:
        self._plan_map = plans
        self.plans_version += 1

    def set_plan(self, index: int, plan: Plan) -> None:
        self._plan_map[index] = plan
        self.plans_version += 1

    def enter(self, new: Phase) -> None:
        check_transition(self.phase, new)
        self.phase = new

    def ranks_of(self, agent_index: int) -> list[int]:
        gen = self.gen
        slot = gen.slot_of(agent_index) if gen is not None else None
        if slot is None:
            return []
        g = self.cfg.workers_per_node
        return list(range(slot * g, (slot + 1) * g))

    def reports_steps(self, gen: Generation) -> bool:
        """Whether this run reports steps at all (a plain script may never do)."""
        return self.state.last_step is not None or bool(gen.pending)

    def next_incident_id(self) -> str:
        """Claim the run's next incident number (the one count a detector takes)."""
        self.state.incidents += 1
        return f"i{self.state.incidents}"

    def incident_from_failure(self, gen: Generation, root: Failure,
                              detected: float) -> Incident:
        return failure_incident(self.next_incident_id(), gen, root, detected, self.state)

    # ------------------------------------------------------------------ actions
    def apply(self, action: act.Action, now: float) -> None:
        """Carry out what a detector or phase handler returned (``Wait``: nothing)."""
        handlers: dict[type, Callable[..., None]] = {
            act.Finish: lambda a, _now: self.finish(a.status, a.verdict),
            act.Handle: self.handle, act.Restart: self._restart,
            act.Capture: self.start_hang_capture, act.Diagnose: self.start_diagnosis,
            act.Concluded: self.conclude_diagnosis, act.Start: self.start_run,
            act.BeginReplay: self.begin_replay, act.ReplayLost: self._replay_lost,
            act.EndBackoff: self.end_backoff}
        handler = handlers.get(type(action))
        if handler is not None:
            handler(action, now)

    def _restart(self, r: act.Restart, now: float) -> None:
        """A hot update due at a step boundary: a new generation in place."""
        self.hot.apply_due(self.state.last_step, now)
        self.begin_generation(list(r.slots), now)

    # ------------------------------------------------------------------ generations
    def start_run(self, start: act.Start, now: float) -> None:
        """The gathered agents: the spares parked, the first generation on the slots."""
        st = self.state
        self.spares = list(start.spares)
        if st.attempt < 0:
            self.events.run_start(start.slot_nodes, start.spare_nodes, self.cfg.world_size,
                                  {"tp": 1, "pp": 1, "dp": self.cfg.world_size},
                                  self.cfg.to_dict())
        elif self.outside_requeue is not None:
            self._record_outside_requeue(self.outside_requeue, now)
        st.restart_count, st.slurm_ending_at = self.ident.restart_count, None
        if st.outage_not_before is not None and now < st.outage_not_before:
            self.enter(Phase.RUNNING)  # the previous allocation's backoff goes on
            self.hold(list(start.slots), st.outage_not_before)
            return
        self.begin_generation(list(start.slots), now)

    def _record_outside_requeue(self, probe: PreviousEndProbe, now: float) -> None:
        """The boundary a requeue the launcher did not make left (external_requeue.py):
        open until this allocation's first step, like the launcher's own requeues."""
        self.outside_requeue = None
        st = self.state
        logged = last_logged_step(self.paths.events)
        last = max((s for s in (st.last_step, logged) if s is not None), default=None)
        incident = probe.incident(self.next_incident_id(), last, now, st.slurm_ending_at)
        incident.rung = Rung.REQUEUE
        if st.open_incident is not None:  # a restart in place Slurm's requeue cut short
            accounting.cut_short(st.open_incident, incident, now)
        st.open_incident = incident
        if not probe.answered:
            # The live metrics count it once, with its cause: when the answer comes.
            self._unanswered = (probe, incident)
            log.warning("incident %s: this allocation follows a requeue by Slurm; its "
                        "cause is still being read from accounting (from step %s)",
                        incident.incident, last)
            return
        self._outside_requeue_known(incident)

    def _outside_requeue_known(self, incident: Incident) -> None:
        for listener in self.listeners:  # the live metrics count it as it opens
            listener.on_incident(incident)
        log.warning("incident %s: this allocation follows a requeue by Slurm (%s): %s "
                    "from step %s", incident.incident,
                    incident.evidence["requeue"]["slurm_state"] or "cause unknown",
                    incident.cls, incident.last_step)

    def settle_outside_requeue(self, final: bool = False) -> None:
        """The requeue's incident takes its cause once accounting has answered (each tick
        asks; cheap), or with whatever is known when it is written (``final``)."""
        if self._unanswered is None:
            return
        probe, incident = self._unanswered
        if not (probe.answered or final):
            return
        self._unanswered = None
        probe.refine(incident)
        self._outside_requeue_known(incident)

    def note_given(self, nodes: Sequence[str]) -> None:
        """Nodes whose agents came up in this allocation (state.json keeps them all)."""
        self.state.given_nodes = sorted(set(self.state.given_nodes) | set(nodes))

    def begin_generation(self, slots: list[int], now: float) -> None:
        """Start a new generation of workers on ``slots`` (agent indices, one per slot)."""
        st = self.state
        if self.gen is not None or st.attempt >= 0:
            for listener in self.listeners:  # a staged hot update goes now
                listener.before_generation(st.last_step, now)
        self._fingerprint(now)
        st.attempt += 1
        st.outage_not_before = None  # any backoff is over once a generation starts
        self.events.attempt = st.attempt
        self.gen_count += 1
        gen = Generation(self.gen_count, st.attempt, list(slots), now)
        self.gen = gen
        st.slots = [self.members[i].node for i in slots]
        self._generation_started(gen, now)
        self.plans = generation_plans(self.plan_context(), gen)
        # What a successor needs (failover.py): the generation, membership and spares.
        st.gen = gen.number
        st.members = {str(i): m.node for i, m in self.members.items() if not m.lost}
        st.spares = [self.members[i].node for i in self.spares]
        self.enter(Phase.RUNNING)
        self.persist()
        log.info("generation %s (attempt %s) on %s, spares %s", gen.number, st.attempt,
                 st.slots, [self.members[i].node for i in self.spares])

    def adopt_generation(self, gen: Generation, spares: list[int], now: float) -> None:
        """A successor's running generation, rebuilt from state.json (adopt.py)."""
        st = self.state
        self.spares = spares
        self.gen_count = gen.number
        self.gen = gen
        self.events.attempt = max(st.attempt, 0)
        self._generation_started(gen, now)
        logged = last_logged_step(self.paths.events)
        st.last_step = max((s for s in (st.last_step, logged) if s is not None), default=None)
        # The old controller announced this attempt once a step finished; not again.
        gen.announced = st.last_step is not None
        self.enter(Phase.RUNNING)
        if st.outage_not_before is not None:  # the old controller was backing off
            self.hold(list(gen.slots), st.outage_not_before)
            return
        self.plans = generation_plans(self.plan_context(), gen)

    def _generation_started(self, gen: Generation, now: float) -> None:
        rank_nodes = [self.members[i].node for i in gen.slots
                      for _ in range(self.cfg.workers_per_node)]
        for listener in self.listeners:
            listener.on_generation(gen, rank_nodes, now)

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

    def plan_context(self) -> PlanContext:
        """What every plan of a generation shares; the code fields (hot update) count a
        change made outside `update` within its window as a recorded change too."""
        code = self.hot.plan_fields()
        ch = self.state.env_change
        if ch is not None and env_change.recent(ch, self.state.last_step):
            code = {**code, "code_change": True}
        return PlanContext(self.cfg, self.ident.job_id, self.state.run_id, self.members,
                           tuple(self.spares), code)

    # ------------------------------------------------------------------ steps
    def step_done(self, gen: Generation, step: int, items: dict[int, Progress],
                  now: float) -> None:
        """Every rank finished ``step``: the run's count, its event, and the open
        incident's recovery."""
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
        phases.on_step(gen, step_time, now, self.state.phase_times)
        losses = [i.loss for i in items.values() if i.loss is not None]
        norms = [i.grad_norm for i in items.values() if i.grad_norm is not None]
        self.state.last_step = step
        end_outage(self.state)  # any outage is over: the next one starts afresh
        for listener in self.listeners:
            listener.on_step(gen, step, step_time, t_done, now)
        # A step finished while the job waits for its requeue (the time limit's
        # generation runs on until Slurm ends it) is the allocation's last, recorded but
        # no recovery: the next allocation's first step is.
        opened = self.state.open_incident is not None and self.phase is not Phase.REQUEUED
        self.events.step(step, step_time, sum(losses) / len(losses) if losses else None,
                         max(norms) if norms else None,
                         force=opened or gen.steps_done == 1, now=t_done)
        if opened:
            self._resolve_open_incident(gen, step, now)
        for listener in self.listeners:  # a hot update's downtime
            listener.on_step_recorded(gen, step, now)
        if now - self.last_persist > 1.0:
            self.persist()

    def _announce_attempt(self, gen: Generation) -> None:
        """Write ``attempt_start`` once the ranks said what they restored (or stepped)."""
        gen.announced = True
        step, tier = restored_of(gen)
        # Stamped with the generation's start: it precedes the attempt's first step, so
        # that step is not counted as redone.
        self.events.attempt_start(list(self.state.slots), step, tier, now=gen.started_at)

    def persist(self) -> None:
        if self.fence.superseded():
            # A successor claimed the next term while this controller was away: its
            # state.json must not be overwritten (the controller stands down).
            raise StoodDown(f"term {self.fence.term} superseded")
        self.last_persist = self.clock()
        self.state.term = max(self.state.term, self.fence.term)
        self.state.hang_limits = phases.limits_table(
            self.state.phase_times, self.cfg.hang_limits, self.cfg.startup_timeout_s)
        for listener in self.listeners:
            listener.on_persist(self.state)
        save_state(self.paths.state, self.state)

    # ------------------------------------------------------------------ the ladder
    def handle(self, h: act.Handle, now: float) -> None:
        """Run the ladder for one incident and apply the decision. ``evict`` (a fatal
        finding of the in-job monitor): ``nodes`` are blamed whatever the class, and the
        text (the check and its evidence) goes into the decision's reason and the verdict.
        ``diagnosis_failed``: stop-time diagnosis failed ``nodes``, blamed the same way."""
        if h.resume:
            self.enter(Phase.RUNNING)
        # A new decision replaces a held-back restart (Slurm's time limit during the
        # wait); state.json keeps its time, so a requeue's allocation waits out the rest.
        self.backoff = None
        st = self.state
        incident = h.incident
        if h.revisits:
            open_inc = st.open_incident
            if open_inc is not None and open_inc.incident == incident.incident:
                st.open_incident = None  # the same incident, resolved now
            else:
                incident = dataclasses.replace(incident, incident=self.next_incident_id(),
                                               recovered_at=None, restored_step=None,
                                               steps_lost=None)
            h = dataclasses.replace(h, incident=incident)
        self._cut_short_open(incident, h.restored, now)
        facts = ladder_facts(h, st, self.cfg, self.ident.node, len(self.spares),
                             self.reports_steps(h.gen), self._batch_node(),
                             self.hot.rollback_reason(incident.cls), now)
        decision = decide(facts)
        if facts.outage_failures:
            note_outage(incident, facts, decision, now)
        self._apply_decision(h.gen, incident, h.signature, decision, h.evict, now,
                             outage=facts.outage_failures > 0)

    def _cut_short_open(self, incident: Incident,
                        restored: tuple[int | None, str | None] | None, now: float) -> None:
        """A new incident while the earlier recovery has not finished: both are kept and
        written together. ``restored``: what the earlier one's generation restored, when
        it ended before finishing a step (the restore itself happened)."""
        st = self.state
        self.events.flush_step()  # the last step before the fault is in the log
        prev = st.open_incident
        if prev is None:
            return
        if restored is not None and prev.restored_step is None:
            prev.restored_step, prev.restore_tier = restored
        accounting.cut_short(prev, incident, now)
        st.open_incident = None

    def _apply_decision(self, gen: Generation, incident: Incident, signature: str | None,
                        decision: Decision, evict: str | None, now: float,
                        outage: bool = False) -> None:
        """The run's counters and the incident, then the rung (stop; or a verdict and
        drain for each evicted node, and a new generation in place, on a spare, or a
        requeue). ``outage``: an external service's outage at start-up, whose restarts
        do not count against max_restarts (their budget is outage_budget_s)."""
        st = self.state
        if decision.batch_lost:
            self.batch_lost = True
        for listener in self.listeners:  # a hot update's rollback
            listener.on_decision(incident, decision, st.last_step, now)
        if signature:
            st.signatures[signature] = st.signatures.get(signature, 0) + 1
        incident.rung = decision.rung
        incident.localized_at = incident.localized_at or now
        incident.nodes = sorted(set(incident.nodes) | set(decision.evict))
        incident.evidence["decision"] = decision.reason
        for listener in self.listeners:  # the rung is decided
            listener.on_incident(incident)
        log.warning("incident %s: %s on %s -> %s (%s)", incident.incident,
                    incident.cls, incident.nodes, decision.rung, decision.reason)
        if decision.rung == Rung.STOP:
            self.write_incident(incident)
            self.finish(RunStatus.STOPPED, decision.reason)
            return
        # An allocation's end is no failure; a service's outage has its own budget.
        if incident.cls != IncidentClass.TIME_LIMIT and not outage:
            st.restarts += 1
        # The verdict names the class and its evidence (flat, "pending deep check").
        reason = blame.verdict_reason(incident.cls, incident.evidence, evict)
        for node in decision.evict:
            self.slurm.verdict(self.paths, self.ident.job_id, node, reason,
                               incident.cls, incident.evidence, incident.incident,
                               self.cfg.site_config)
        if decision.evict and self.cfg.drain:
            evict_nodes = list(decision.evict)
            self.start_action("drain", lambda: self.slurm.drain(evict_nodes, reason))
        st.open_incident = incident
        if decision.rung == Rung.REQUEUE:
            self._start_requeue(decision)
        elif decision.rung == Rung.SPARE:
            self.begin_generation(self._replace(gen, decision), now)
        elif decision.delay_s > 0:
            self.hold(gen.slots, now + decision.delay_s)
        else:
            self.begin_generation(gen.slots, now)

    # ------------------------------------------------------------------ backoff
    def hold(self, slots: Sequence[int], not_before: float) -> None:
        """Start the next generation on ``slots`` no earlier than ``not_before``: their
        agents hold meanwhile (workers stopped; a plan for the next generation number, so
        late exits of the failed one are not counted). The tick ends it: the detector
        ``backing_off`` returns ``EndBackoff``, applied by :meth:`end_backoff`."""
        self.backoff = Backoff(tuple(slots), not_before)
        self.state.outage_not_before = not_before
        gen = self.gen
        if gen is not None:  # decided: what the failed group still reports is history
            gen.failures.clear()
            gen.first_failure_seen = None
        plans = dict(self.plans)
        for index in slots:
            plans[index] = Plan(role=Role.HOLD, gen=self.gen_count + 1,
                                attempt=self.state.attempt)
        self.plans = plans
        self.persist()
        log.warning("backing off: the next generation starts on %s at the earliest in "
                    "%.0f s", [self.members[i].node for i in slots],
                    not_before - self.clock())

    def end_backoff(self, e: act.EndBackoff, now: float) -> None:
        """A held-back restart's time has come: its generation starts. An agent of the
        slots lost meanwhile (``e.lost``) ends the wait at once: its ``node_lost``
        failure goes to the ladder (the next tick's detectors)."""
        wait = self.backoff
        if wait is None:
            return
        lost = list(e.lost)
        self.backoff = None
        self.state.outage_not_before = None
        gen = self.gen
        if lost and gen is not None:
            gen.failures[:] = [f for f in gen.failures if f.agent in lost and
                               f.exit.cls == IncidentClass.NODE_LOST]
            gen.first_failure_seen = min((f.seen for f in gen.failures), default=None)
            if gen.failures:
                return
        self.begin_generation(list(wait.slots), now)

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

    # ------------------------------------------------------------------ replay
    def begin_replay(self, b: act.BeginReplay, now: float) -> None:
        """A phase of a dual-phase replay: an attempt per group (its own port and draws),
        one generation on the NaN's slots, phase ``replaying``."""
        st = self.state
        if b.first:
            self._cut_short_open(b.replay.incident, b.restored, now)
        first = st.attempt + 1
        st.attempt += len(b.groups)
        self.gen_count += 1
        gen = Generation(self.gen_count, first, list(b.replay.origin_gen.slots), now)
        self.gen = gen
        self.plans = replay_plans(self.plan_context(), gen, b.groups, b.replay)
        self.enter(Phase.REPLAYING)
        self.persist()
        log.info("replay %s: %s phase, groups %s", b.replay.id, b.phase.value,
                 [[self.members[gen.slots[m]].node for m in grp] for grp in b.groups])

    def _replay_lost(self, lost: act.ReplayLost, now: float) -> None:
        # The lost agent's failure is the next incident; this one stays open until the
        # ladder's next generation recovers (it is then written, cut short). The
        # generation stays the replay's, so the next plans' numbers keep increasing.
        self.state.open_incident = lost.incident
        self.enter(Phase.RUNNING)

    # ------------------------------------------------------------------ requeue
    def _start_requeue(self, decision: Decision) -> None:
        st = self.state
        st.requeues += 1
        st.blamed = sorted(set(st.blamed) | set(decision.evict))
        self.persist()
        gen_no = self.gen.number + 1 if self.gen else 1
        self.plans = {i: Plan(role=Role.HOLD, gen=gen_no, attempt=st.attempt)
                      for i in self.members}
        self.enter(Phase.REQUEUED)
        self._requeue = PendingRequeue(self.start_action, self.ident.job_id,
                                       list(st.blamed), self.slurm.capacity,
                                       self.slurm.requeue,
                                       ShortfallPolicy(self.cfg.on_shortfall), self.cfg.nodes)

    def start_action(self, name: str, call: Callable[[], object]) -> SlurmAction:
        action = SlurmAction(name, call, self.clock).start()
        self.slurm_actions.append(action)
        return action

    def poll_requeue(self) -> None:
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

    # ------------------------------------------------------------------ diagnosis, hangs
    def start_diagnosis(self, d: act.Diagnose, now: float) -> None:
        """Ask the suspected node's agent to run diagnose(node); the others wait."""
        gen, root, incident = d.gen, d.root, d.incident
        did = f"{incident.incident}-g{gen.number}"
        side = root.exit.side.value if root.exit.side is not None else None
        gen.diagnosis = PendingDiagnosis(did, root.agent, root.node, incident,
                                         root.exit.signature, now, now + DIAGNOSIS_WAIT_S,
                                         side)
        self.set_plan(root.agent, dataclasses.replace(self.plans[root.agent], diagnose=did))
        self.enter(Phase.DIAGNOSING)
        log.warning("incident %s: %s on %s has no clear side; diagnosing %s (%s)",
                    incident.incident, incident.cls, root.node, root.node, did)

    def conclude_diagnosis(self, c: act.Concluded, now: float) -> None:
        """The diagnosis is over: its evidence into the incident, then the ladder."""
        pending, done, gen = c.pending, c.conclusion, c.gen
        incident = pending.incident
        gen.diagnosis = None
        self.enter(Phase.RUNNING)
        incident.evidence.update(done.evidence)
        if done.localized_at is not None:
            incident.localized_at = done.localized_at
        if done.cleared:
            self.state.diagnosis_passed = sorted({*self.state.diagnosis_passed, done.cleared})
        self.handle(act.Handle(gen, incident, pending.signature, [pending.node],
                               diagnosis_failed=done.failed, diagnosis_passed=done.passed,
                               side=pending.side), now)

    def start_hang_capture(self, c: act.Capture, now: float) -> None:
        """A hang: ask every active agent for a stack dump before anything is killed."""
        gen = c.gen
        if c.signal is not None:
            gen.hang_signal = c.signal
        gen.hang_limit = c.limit
        gen.capture = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-g{gen.number}"
        gen.capture_deadline = now + CAPTURE_BUDGET_S
        gen.hang_detected = now
        for index in gen.slots:
            self.set_plan(index, dataclasses.replace(self.plans[index], stacks=gen.capture))
        self.enter(Phase.DUMPING)
        log.warning("hang: no step for %.1f s; capturing stacks as %s",
                    now - gen.last_progress, gen.capture)

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
        self.write_incident(incident)
        for listener in self.listeners:
            listener.on_recovered(incident)
        self.state.open_incident = None
        self.persist()
        log.info("incident %s recovered in %.2f s (restored step %s from %s)",
                 incident.incident,
                 now - (incident.fault_time or incident.detected_at), restored, tier)

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
        self.write_incident(incident)
        self.state.open_incident = None

    def write_incident(self, incident: Incident) -> None:
        self.settle_outside_requeue(final=True)
        if incident.rung is None:
            incident.rung = Rung.STOP
        for cut in accounting.settle(incident):  # incidents it cut short, first
            self.events.incident(accounting.ordered_times(cut))
        self.events.incident(accounting.ordered_times(incident))

    def finish(self, status: str, verdict: str | None, write: bool = True) -> None:
        """End the run: ``run_end``, state, and an exit plan for every agent."""
        if self.phase is Phase.DONE:
            return
        gen = self.gen
        final = gen.finals.get(0) if gen else None
        step = final.step if final is not None and final.step is not None \
            else self.state.last_step
        digest = final.params_sha256 if final is not None else None
        if write:
            self._write_end(status, verdict, step, digest)
        # The snapshots are keyed by job id: a resubmission (new job) cannot use them, and
        # tmpfs pages are node memory, so every ending frees them (the durable tier stays).
        self.plans = {i: Plan(role=Role.EXIT, exit_code=0, purge=True) for i in self.members}
        self.result = RunOutcome(RunStatus(status), verdict, step, digest,
                                 self.state.attempt, self.state.restarts)
        self.enter(Phase.DONE)
        self.done_at = self.clock()
        log.info("run %s: %s%s", self.state.run_id, status, f" ({verdict})" if verdict else "")

    def _write_end(self, status: str, verdict: str | None, step: int | None,
                   digest: str | None) -> None:
        if status == RunStatus.COMPLETED and self.state.open_incident is not None:
            self._close_on_completion(self.gen, self.clock())
        self.events.flush_step()
        if self.state.open_incident is not None:
            # The incident that ends a run (a refused requeue, a failure mid-recovery)
            # reaches the event log too, as it stood.
            self.write_incident(self.state.open_incident)
            self.state.open_incident = None
        self.events.run_end(status, step, digest, verdict)
        self.state.finished, self.state.verdict = status, verdict
        self.persist()


def note_outage(incident: Incident, facts: Facts, decision: Decision, now: float) -> None:
    """The incident's record of an external service's outage at start-up
    (docs/SCHEMAS.md, evidence.outage): the service, how long it has been down, this
    failure's number in the outage, and the backoff taken (null: the budget is spent)."""
    backing_off = decision.rung == Rung.IN_PLACE and facts.cls in OUTAGE_CLASSES
    incident.evidence["outage"] = {
        "service": facts.outage_service, "since": round(now - facts.outage_s, 3),
        "lasted_s": round(facts.outage_s, 3), "failures": facts.outage_failures,
        "budget_s": facts.outage_budget_s,
        "backoff_s": decision.delay_s if backing_off else None,
        "not_before": round(now + decision.delay_s, 3) if backing_off else None}
