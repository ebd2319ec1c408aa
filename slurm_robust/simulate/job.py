"""The simulated job under the real recovery ladder.

Per incident: the fault ends the running segment (the step in flight is lost: the
recompute time; every step is checkpointed, so nothing else is), detection and
localisation take their drawn (or detector-decided) time, then
:func:`slurm_robust.launcher.control.ladder.decide` chooses the rung from the same facts the
controller gathers (restarts, no-progress streak, signatures, spares left, the
controller's node), and the rung is applied:

- ``in_place``: the restart time (after the ladder's backoff, ``delay_s``, for an
  external service's or remote storage's failure before the attempt's first step:
  launcher/control/outage.py);
- ``spare``: blamed machines are evicted (drain, deep check, pool or repair) and
  replaced by in-job spares, then the spare-activation time;
- ``requeue``: blamed machines are evicted, the reserve hands spares over (real
  handoff plan), the job waits for enough idle machines for its slots and spares, then
  the requeue time;
- ``stop``: the run ends; after the resubmit time and the requeue time a new submission
  starts with a fresh restart budget (the event log keeps the run id, so the report
  counts the gap as wall time).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from slurm_robust.launcher.control.ladder import Facts, decide
from slurm_robust.launcher.control.outage import startup_outage
from slurm_robust.launcher.control.policy import unexplained_repeats
from slurm_robust.simulate import paper
from slurm_robust.simulate.config import FAIL_SLOW_VOTE, HANG_TIMEOUT
from slurm_robust.simulate.detectors import fail_slow_vote, hang_detection_s, launch_default
from slurm_robust.simulate.eventlog import EventSink
from slurm_robust.simulate.fleet import Fleet, Place
from slurm_robust.simulate.reserve import Reserve
from slurm_robust.simulate.results import IncidentResult
from slurm_robust.simulate.trace import TraceIncident
from slurm_robust.taxonomy import row as taxonomy_row
from slurm_robust.vocabulary import Rung, RunStatus

UNLIMITED = -1  # --spares value of the oracle: every blamed machine has a spare


@dataclass(frozen=True)
class LadderLimits:
    """The launcher's ladder settings (RunConfig defaults unless overridden)."""

    max_restarts: int = int(launch_default("max_restarts"))  # type: ignore[call-overload]
    max_no_progress: int = int(launch_default("max_no_progress"))  # type: ignore[call-overload]
    node_failures_to_blame: int = int(
        launch_default("node_failures_to_blame"))  # type: ignore[call-overload]
    outage_budget_s: float = float(launch_default("outage_budget_s"))  # type: ignore[arg-type]
    outage_backoff_s: float = float(launch_default("outage_backoff_s"))  # type: ignore[arg-type]
    outage_backoff_max_s: float = float(
        launch_default("outage_backoff_max_s"))  # type: ignore[arg-type]


@dataclass
class JobState:
    """What the controller keeps across restarts of one submission."""

    restarts: int = 0
    no_progress: int = 0
    signatures: dict[str, int] = field(default_factory=dict)
    failures_by_node: dict[str, int] = field(default_factory=dict)
    # An external service's outage at start-up (launcher/control/outage.py).
    outage_since: float | None = None
    outage_failures: int = 0


class Job:
    """One long training job of ``machines`` slots and ``spares`` in-job spares."""

    def __init__(self, env: simpy.Environment, fleet: Fleet, reserve: Reserve,
                 trace: list[TraceIncident], machines: int, spares: int, step_s: float,
                 limits: LadderLimits, refill: bool, sink: EventSink,
                 count: Callable[[], None], wait_for_nodes: bool = True,
                 switch_machines: int = 32, hang_phases: bool = True) -> None:
        self.env, self.fleet, self.reserve = env, fleet, reserve
        self.trace = trace
        self.step = step_s
        self.hang_s = hang_detection_s(step_s, hang_phases)
        self.limits = limits
        self.refill = refill
        self.sink = sink
        self.count = count
        self.unlimited = spares == UNLIMITED
        self.want_spares = 0 if self.unlimited else spares
        self.slots = [fleet.add(Place.JOB) for _ in range(machines)]
        self.slot_of = {m: i for i, m in enumerate(self.slots)}  # O(1) replacement
        self.spares = [fleet.add(Place.JOB) for _ in range(self.want_spares)]
        self.state = JobState()
        self.incidents: list[IncidentResult] = []
        self.segments: list[tuple[float, int]] = []  # (start, completed steps)
        self.spare_level: list[tuple[float, int]] = [(0.0, len(self.spares))]
        self.steps_done = 0
        self.spares_used = 0
        self.wait_for_nodes = wait_for_nodes
        self.switch_machines = switch_machines
        self.running_since: float | None = None

    def finish(self, end: float) -> None:
        """At the horizon: count the steps of a segment still running, end the run."""
        if self.running_since is not None:
            self._segment(self.running_since, int((end - self.running_since) // self.step))
            self.running_since = None
        self.sink.run_end(RunStatus.COMPLETED, self.steps_done, end)

    # -- helpers ---------------------------------------------------------------------

    def _name(self, m: int) -> str:
        return self.fleet.names[m]

    def _names(self, machines: list[int]) -> list[str]:
        if self.sink.path is None:
            return []  # nothing is written: skip the O(machines) list
        names = self.fleet.names
        return [names[m] for m in machines]

    def _replace(self, old: int, new: int) -> None:
        pos = self.slot_of.pop(old)
        self.slots[pos] = new
        self.slot_of[new] = pos

    def _set_spares(self, spares: list[int]) -> None:
        self.spares = spares
        if self.spare_level[-1][1] != len(spares):
            self.spare_level.append((self.env.now, len(spares)))

    def _wait(self, seconds: float) -> simpy.Timeout:
        self.count()
        return self.env.timeout(max(seconds, 0.0))

    def _count_outage(self, cls: str, progressed: bool) -> bool:
        """The controller's count (run_facts.count_outage): True for an outage at
        start-up, which the no-progress streak does not count; anything else ends it."""
        st = self.state
        if startup_outage(cls, progressed):
            st.outage_since = self.env.now if st.outage_since is None else st.outage_since
            st.outage_failures += 1
            return True
        st.outage_since, st.outage_failures = None, 0
        st.no_progress = 0 if progressed else st.no_progress + 1
        return False

    def _facts(self, cls: str, named: list[str], signature: str,
               machine_fault: bool, outage: bool = False, service: str | None = None
               ) -> Facts:
        """The ladder's facts from the simulated state (counted with this incident).
        Stop-time diagnosis is modelled only where it decides blame, for a class that is
        no evidence against a node by itself repeating on one (policy.unexplained_repeats):
        it fails on a machine whose fault is persistent (``machine_fault``: the trace's
        fault follows the machine) and passes otherwise. What the simulator does not model
        keeps its default: no NaN ladder, hot update, batch-step node or blame cap."""
        st = self.state
        failures = {n: st.failures_by_node.get(n, 0) for n in named}
        diagnosed = unexplained_repeats(cls, named, failures,
                                        self.limits.node_failures_to_blame)
        failed = bool(diagnosed) and machine_fault
        return Facts(
            cls=cls, controller_node=self._name(self.slots[0]),
            spares_left=10**9 if self.unlimited else len(self.spares),
            restarts=st.restarts, max_restarts=self.limits.max_restarts,
            signature=signature, signature_seen=st.signatures.get(signature, 0),
            no_progress=st.no_progress, max_no_progress=self.limits.max_no_progress,
            named=tuple(named), failures=failures,
            failures_to_blame=self.limits.node_failures_to_blame,
            blame_named=failed, diagnosis_passed=bool(diagnosed) and not failed,
            diagnosis_reason=("stop-time diagnosis (simulated): the fault recurs on this "
                              "machine") if failed else None,
            outage_failures=st.outage_failures if outage else 0,
            outage_s=self.env.now - (st.outage_since or self.env.now) if outage else 0.0,
            outage_service=service if outage else None,
            outage_budget_s=self.limits.outage_budget_s,
            outage_backoff_s=self.limits.outage_backoff_s,
            outage_backoff_max_s=self.limits.outage_backoff_max_s)

    # -- the run ---------------------------------------------------------------------

    def run(self) -> Generator[Any, Any, None]:
        self.sink.run_start(self._names(self.slots),
                            self._names(self.spares), 0.0)
        self.sink.attempt_start(self._names(self.slots), None, 0.0)
        running = 0.0
        # Recurrences of persistent faults: (run_at, seq, incident, k-th, machine).
        pending: list[tuple[float, int, TraceIncident, int, int]] = []
        nxt = 0
        seq = 0
        while True:
            primary = self.trace[nxt].run_at if nxt < len(self.trace) else math.inf
            if pending and pending[0][0] < primary:
                run_at, _, inc, k, machine = heapq.heappop(pending)
                if self.slots[inc.slot] != machine:
                    continue  # the faulty machine has left the slot: no recurrence
            else:
                if primary == math.inf:
                    self.running_since = self.env.now
                    yield self.env.event()  # never fires: runs to the horizon
                    return
                run_at, inc, k, machine = primary, self.trace[nxt], 0, self.slots[
                    self.trace[nxt].slot]
                nxt += 1
            seg_start = self.running_since = self.env.now
            yield self._wait(run_at - running)
            self.running_since = None
            steps = int((run_at - running) // self.step)
            running = run_at
            self._segment(seg_start, steps)
            evicted = yield from self._incident(inc, k, machine, steps, seg_start)
            recurs = inc.persistent and inc.fclass.cls != "mfu_decline" and not inc.switch
            if recurs and machine not in evicted and k < len(inc.recur_after):
                seq += 1
                heapq.heappush(pending, (running + inc.recur_after[k], seq, inc, k + 1,
                                         machine))

    def _segment(self, start: float, steps: int) -> None:
        self.segments.append((start, steps))
        self.sink.steps(start, self.steps_done, steps, self.step)
        self.steps_done += steps

    def _incident(self, inc: TraceIncident, k: int, machine: int, steps: int,
                  seg_start: float) -> Generator[Any, Any, tuple[int, ...]]:
        fc = inc.fclass
        fault = self.env.now
        lost = fault - seg_start - steps * self.step
        name = self._name(machine)
        named = [name]
        cls = fc.cls
        if inc.switch:
            # Every machine behind the switch loses its heartbeat: a node fault on each.
            size = self.switch_machines
            block = self.slots[inc.slot // size * size:(inc.slot // size + 1) * size]
            named, cls = [self._name(m) for m in block], "node_lost"
            det, loc = paper.DETECT_SWITCH_S, 0.0
        elif fc.detect == FAIL_SLOW_VOTE:
            det, loc, voted = fail_slow_vote([self._name(m) for m in self.slots], inc.slot,
                                             inc.slow_factor, self.step)
            named = list(voted) or named
        else:
            det = self.hang_s if fc.detect == HANG_TIMEOUT else inc.detect
            loc = inc.localise
        yield self._wait(det)
        detected = self.env.now
        yield self._wait(loc)
        localized = self.env.now
        st = self.state
        outage = self._count_outage(cls, steps > 0)
        for n in named:
            st.failures_by_node[n] = st.failures_by_node.get(n, 0) + 1
        signature = f"{cls}:{inc.index}"
        machine_fault = inc.persistent and not inc.switch
        decision = decide(self._facts(cls, named, signature, machine_fault, outage,
                                      fc.name))
        st.signatures[signature] = st.signatures.get(signature, 0) + 1
        result = IncidentResult(inc.index * 100 + k, fc.name, cls, fault, detected,
                                localized, None, decision.rung, tuple(decision.evict or named),
                                lost, reason=decision.reason)
        self.incidents.append(result)
        evicted = tuple(self.fleet.index(n) for n in decision.evict)
        if decision.rung == Rung.STOP:
            yield from self._stop(inc, result)
        else:
            st.restarts += 0 if outage else 1  # an outage has its own budget
            if decision.rung == Rung.IN_PLACE:
                yield self._wait(decision.delay_s + inc.restart)
            elif decision.rung == Rung.SPARE:
                self._use_spares(evicted, inc.refill)
                yield self._wait(inc.spare)
            else:
                yield from self._requeue(evicted, result)
                yield self._wait(inc.requeue)
        result.recovered = self.env.now
        self.sink.incident(result, taxonomy_row(cls).category.value, self.steps_done)
        self.sink.attempt_start(self._names(self.slots), self.steps_done,
                                self.env.now)
        return evicted

    def _evict(self, evicted: tuple[int, ...]) -> None:
        for m in evicted:
            self.reserve.evictions.append(self.env.now)
            self.fleet.evict(m)

    def _use_spares(self, evicted: tuple[int, ...], refill_s: float) -> None:
        spares = list(self.spares)
        for m in evicted:
            self._replace(m, self.fleet.add(Place.JOB) if self.unlimited else spares.pop(0))
            self.spares_used += 1
            if self.refill:
                self.env.process(self._refill_one(refill_s))
        self._set_spares(spares)
        self._evict(evicted)
        self.reserve.reconcile()

    def _refill_one(self, delay_s: float) -> Generator[Any, Any, None]:
        """The paper's asynchronous standby refill (``--refill-spares``)."""
        yield self._wait(delay_s)
        while True:
            m = self.reserve.take_one()
            if m is None and self.fleet.pool:
                m = self.fleet.take_from_pool(1)[0]
            if m is not None:
                self._set_spares([*self.spares, m])
                self.reserve.reconcile()
                return
            yield self.fleet.changed

    def _requeue(self, evicted: tuple[int, ...],
                 result: IncidentResult) -> Generator[Any, Any, None]:
        self._evict(evicted)
        self.reserve.handoff(self.sink.job_id, list(evicted))
        need = len(evicted) + max(self.want_spares - len(self.spares), 0)
        start = self.env.now
        yield from self._take(need, evicted)
        result.queue_wait_s = self.env.now - start

    def _take(self, need: int, evicted: tuple[int, ...] = ()) -> Generator[Any, Any, None]:
        self.reserve.blocked = True
        while len(self.fleet.pool) < need and self.wait_for_nodes:
            yield self.fleet.changed
        got = self.fleet.take_from_pool(need) if self.wait_for_nodes else \
            [self.fleet.add(Place.JOB) for _ in range(need)]
        self.reserve.blocked = False
        for m in evicted:
            self._replace(m, got.pop(0))
        self._set_spares([*self.spares, *got])
        self.reserve.reconcile()

    def _stop(self, inc: TraceIncident, result: IncidentResult) -> Generator[Any, Any, None]:
        self.sink.run_end("stopped", self.steps_done, self.env.now)
        yield self._wait(inc.resubmit)
        start = self.env.now
        yield from self._take(max(self.want_spares - len(self.spares), 0))
        result.queue_wait_s = self.env.now - start
        yield self._wait(inc.requeue)
        self.state = JobState()
        self.sink.run_start(self._names(self.slots),
                            self._names(self.spares), self.env.now)
