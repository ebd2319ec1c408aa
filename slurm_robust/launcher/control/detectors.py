"""The running phase's detectors and the other phases' handlers: each reads the run and
returns an action (actions.py), or None when its condition does not hold.

In priority order while running (or capturing a hang's stacks): bitwise test, completion,
the time limit, failures, a due hot update, monitor findings, a hang capture, a hang, fail-slow; the
first that returns an action ends the tick. Nothing here writes the run's phase,
generation, plans, spares or state.json: the applier (applier.py) does, with what is
returned. What a detector does consume is its own feature's input (a monitor finding
taken, a fail-slow vote polled) and the incident number it claims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import actions as act
from slurm_robust.launcher.control import failslow, phases
from slurm_robust.launcher.control import monitor as node_monitor
from slurm_robust.launcher.control.generation import Failure, Generation, Member
from slurm_robust.launcher.control.hang import capture_incident
from slurm_robust.launcher.control.hot_update import HotUpdate
from slurm_robust.launcher.control.listeners import MonitorListener
from slurm_robust.launcher.control.nan_recovery import NanRecovery
from slurm_robust.launcher.control.outage import Backoff, startup_outage
from slurm_robust.launcher.control.policy import is_hung, made_progress
from slurm_robust.launcher.control.state import RunState
from slurm_robust.launcher.control.stop_diagnosis import (
    conclude,
    diagnosed_before,
    wants_diagnosis,
)
from slurm_robust.launcher.control.time_limit import TimeLimitWatch, time_limit_incident
from slurm_robust.launcher.enums import IncidentClass, Phase, RunStatus
from slurm_robust.launcher.messages import DiagnosisReport, Incident
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.stacks.failslow import FailSlowDecision

log = logging.getLogger("slurm_robust.launcher.control.recovery")

#: Wait at most this long after the first primary failure for the others of the same
#: moment (the earliest is the root cause) ...
SETTLE_S = 0.3
#: ... or until every active agent has reported this long after it: agents report a
#: worker's exit the moment it happens (workers.wait_for_exit), so an earlier failure
#: would be in those reports. The margin covers clock skew between nodes (exit times are
#: the agents' clocks) and one hurried report interval.
SETTLE_HEARD_S = 0.05

Detector = Callable[[Generation, float], "act.Action | None"]


class RunView(Protocol):
    """What the detectors read of the run (the applier, read-only but for the incident
    number a detector claims)."""

    cfg: RunConfig
    members: Mapping[int, Member]
    state: RunState
    paths: RunPaths
    spares: list[int]
    step_times: list[float]
    phase: Phase

    def ranks_of(self, agent_index: int) -> list[int]: ...

    def reports_steps(self, gen: Generation) -> bool: ...

    def next_incident_id(self) -> str: ...

    def incident_from_failure(self, gen: Generation, root: Failure,
                              detected: float) -> Incident: ...


class Detectors:
    """See the module docstring."""

    def __init__(self, run: RunView, hot: HotUpdate, nans: NanRecovery,
                 watch: MonitorListener,
                 diagnoses: Mapping[tuple[int, str], DiagnosisReport],
                 limit: TimeLimitWatch | None = None,
                 elapsed: Callable[[float, float], float] | None = None) -> None:
        self.run, self.hot, self.nans, self.watch = run, hot, nans, watch
        self.diagnoses = diagnoses
        self.limit = limit or TimeLimitWatch()
        #: Seconds between two moments that count against the nodes: the controller's
        #: responsive time (overload.py). A late controller must neither cut a failure's
        #: settle short (the root cause's report may wait behind the stall and another
        #: node be blamed) nor see a hang in its own silence.
        self.elapsed = elapsed or (lambda since, now: now - since)

    def running(self) -> tuple[Detector, ...]:
        """The running phase's detectors, in priority order."""
        return (self.bitwise,  # before a NaN of the faulty node
                self.completion,
                # Before failures: workers the scheduler is about to end are no fault.
                self.time_limit,
                # Before a pending capture: a crash or a lost node during the capture is
                # the better-localized fault, and a lost agent cannot restart in place.
                self.failures, self.hot_update, self.monitor, self.capture, self.hang,
                self.fail_slow)

    # ------------------------------------------------------------------ detectors
    def bitwise(self, gen: Generation, now: float) -> act.Action | None:
        return self.nans.bitwise_tick(gen, now)

    def backing_off(self, wait: Backoff, gen: Generation | None,
                    now: float) -> act.Action:
        """While a restart is held back (an outage's backoff): Slurm's time limit, then
        the wait's end (its time, or an agent of its slots lost)."""
        limit = self.time_limit(gen, now) if gen is not None else None
        if limit is not None:
            return limit
        lost = tuple(i for i in wait.slots if self.run.members[i].lost)
        if not lost and now < wait.not_before:
            return act.Wait()
        return act.EndBackoff(lost)

    def completion(self, gen: Generation, now: float) -> act.Action | None:
        if len(gen.succeeded) < len(gen.slots) * self.run.cfg.workers_per_node:
            return None  # every tick: not the world's ranks in a set until it can be done
        active = {r for i in gen.slots for r in self.run.ranks_of(i)}
        if not (active and active <= gen.succeeded):
            return None
        return act.Finish(RunStatus.COMPLETED, None)

    def time_limit(self, gen: Generation, now: float) -> act.Action | None:
        """Slurm's warning before the time limit: requeue with the newest step."""
        run = self.run
        if run.phase is not Phase.RUNNING:
            return None
        self.limit.refresh(now)
        if not self.limit.due(now) or not self.limit.take():
            return None
        incident = time_limit_incident(run.next_incident_id(), self.limit,
                                       run.state.last_step, now)
        log.warning("time limit near (%s%s): requeueing from step %s", self.limit.source,
                    f" on {self.limit.node}" if self.limit.node else "", run.state.last_step)
        return act.Handle(gen, incident, None, [])

    def failures(self, gen: Generation, now: float) -> act.Action | None:
        """Decide once the root cause is clear: the earliest primary failure once every
        active agent has reported since (at most a short settle time after it), or the
        earliest secondary one after a heartbeat timeout."""
        if not gen.failures:
            return None
        primary = [f for f in gen.failures if not f.exit.secondary]
        first_seen = gen.first_failure_seen or now
        if primary:
            first = min(f.seen for f in primary)
            if self.elapsed(first, now) < SETTLE_S and \
                    not self._all_heard_since(gen, first + SETTLE_HEARD_S):
                return act.Wait()
            root = min(primary, key=lambda f: f.exit.time)
        elif self.elapsed(first_seen, now) < self.run.cfg.heartbeat_timeout_s:
            return act.Wait()
        else:
            root = min(gen.failures, key=lambda f: f.exit.time)
        if root.exit.cls == IncidentClass.NAN:  # the NaN ladder
            if self.nans.settling(gen, primary, now):
                return act.Wait()
            return self.nans.handle(gen, root, first_seen, now)
        incident = self.run.incident_from_failure(gen, root, first_seen)
        # --- unclear side, nobody blamed -> stop-time diagnosis -----
        if self._wants_diagnosis(gen, root, now):
            return act.Diagnose(gen, root, incident)
        repeat = diagnosed_before(root.exit.signature, self.run.state.diagnosis_passed)
        side = root.exit.side.value if root.exit.side is not None else None
        return act.Handle(gen, incident, root.exit.signature, [root.node],
                          diagnosed_repeat=repeat, side=side)

    def hot_update(self, gen: Generation, now: float) -> act.Action | None:
        """A hot update due at a step boundary: a new generation in place."""
        run = self.run
        if run.phase is not Phase.RUNNING or \
                not self.hot.tick(run.state.last_step, run.reports_steps(gen), now):
            return None
        return act.Restart(list(gen.slots))

    def monitor(self, gen: Generation, now: float) -> act.Action | None:
        """The in-job monitor: a fatal finding of an active node evicts it through the
        ladder; the GPU-derived fail-slow vote and the idle-hang rule act like their
        script-fed counterparts."""
        run, findings = self.run, self.watch.findings
        if run.phase is not Phase.RUNNING:
            return None
        pending = findings.take_fatal(set(gen.slots))
        if pending is not None:
            incident = node_monitor.incident_of(pending, run.next_incident_id(),
                                                run.state.last_step,
                                                run.ranks_of(pending.agent), now)
            return act.Handle(gen, incident, None, [pending.node],
                              evict=node_monitor.verdict_reason(pending))
        mon = findings.gpu_failslow
        decision = mon.poll(now) if mon is not None else None
        if decision is not None:
            return self._fail_slow_incident(gen, decision, now)
        if gen.steps_done == 0:
            idle = findings.idle_hang([run.members[i].node for i in gen.slots],
                                      gen.last_progress, now, run.cfg.hang_floor_s)
            if idle is not None:
                log.warning("implicit hang: %s", idle)
                return act.Capture(gen, idle)
        return None

    def capture(self, gen: Generation, now: float) -> act.Action | None:
        """The capture is done once every live agent sent its stacks, or at its deadline;
        then the hang is an incident (restarted in place, the suspects named)."""
        run = self.run
        if run.phase is not Phase.DUMPING:
            return None
        views = [run.members[i] for i in gen.slots if not run.members[i].lost]
        done = [v for v in views if gen.capture in v.stacks]
        if len(done) < len(views) and now < gen.capture_deadline:
            return act.Wait()
        incident = capture_incident(run.next_incident_id(), gen, views, run.paths.stacks,
                                    run.state.last_step, now)
        return act.Handle(gen, incident, None, [], resume=True)

    def hang(self, gen: Generation, now: float) -> act.Action | None:
        """No progress for longer than the limit of the phase the group is in
        (control/phases.py), or, for a run that never declared a phase, the one rule
        of policy.is_hung."""
        run, cfg = self.run, self.run.cfg
        # Silence without the controller's own lateness since the last progress: the
        # late time is the controller's silence, not the group's.
        silent_s = self.elapsed(gen.last_progress, now)
        if run.state.declares_phases:
            stepping = run.reports_steps(gen)
            limit = phases.group_limit(gen, run.state.phase_times, cfg.hang_limits,
                                       cfg.startup_timeout_s, run.step_times,
                                       cfg.hang_floor_s, cfg.hang_factor, stepping)
            if silent_s <= limit["limit_s"]:
                return None
            if limit["phase"] in (phases.STARTUP, phases.STEPS) and not stepping:
                return None  # as in the single rule: no step ever, no step limit
            log.warning("hang in phase %s: no progress for %.1f s (limit %.1f s)",
                        limit["phase"], silent_s, limit["limit_s"])
            return act.Capture(gen, limit=limit)
        if not is_hung(gen.last_progress, gen.last_progress + silent_s, run.step_times,
                       cfg.hang_floor_s, cfg.hang_factor, gen.steps_done > 0,
                       cfg.startup_timeout_s, run.reports_steps(gen),
                       finishing=bool(gen.finishing)):
            return None
        return act.Capture(gen)

    def fail_slow(self, gen: Generation, now: float) -> act.Action | None:
        mon = self.watch.failslow
        decision = mon.poll(now) if mon is not None else None
        if decision is None:
            return None
        return self._fail_slow_incident(gen, decision, now)

    # ------------------------------------------------------------------ phase handlers
    def diagnosing(self, gen: Generation, now: float) -> act.Action | None:
        """Phase ``diagnosing``: the asked agent's answer, its loss, or the deadline."""
        pending = gen.diagnosis
        if pending is None:  # cannot happen: DIAGNOSING is only entered with one
            return act.Finish(RunStatus.FAILED,
                              "recovery: diagnosing without a pending diagnosis")
        member = self.run.members.get(pending.agent)
        lost = member is None or member.lost
        done = conclude(pending, self.diagnoses.get((pending.agent, pending.id)), lost, now)
        return None if done is None else act.Concluded(gen, pending, done)

    # ------------------------------------------------------------------ helpers
    def _fail_slow_incident(self, gen: Generation, decision: FailSlowDecision,
                            now: float) -> act.Action:
        """The fail-slow vote named a group: evict its node(s) through the ladder."""
        run = self.run
        incident = failslow.incident_of(decision, run.next_incident_id(),
                                        run.state.last_step, now,
                                        run.cfg.fail_slow_interval_s)
        return act.Handle(gen, incident, None, list(decision.eviction.nodes))

    def _all_heard_since(self, gen: Generation, t: float) -> bool:
        """Whether every agent of the generation's slots has reported at ``t`` or later
        (a lost one never has: the settle then runs its full time)."""
        for index in gen.slots:
            member = self.run.members.get(index)
            if member is None or member.lost or member.last_seen < t:
                return False
        return True

    def _wants_diagnosis(self, gen: Generation, root: Failure, now: float) -> bool:
        run = self.run
        progressed = made_progress(gen.steps_done, run.reports_steps(gen),
                                   now - gen.started_at)
        if startup_outage(str(root.exit.cls), progressed):
            return False  # a service's outage at start-up: the node's checks say nothing
        member = run.members.get(root.agent)
        can_answer = member is not None and not member.lost and root.agent not in run.spares
        return wants_diagnosis(root, run.state.node_failures,
                               run.cfg.node_failures_to_blame, run.state.diagnosis_passed,
                               can_answer)
