"""The controller's own lateness, and why it must cost no agent its place.

The controller judges liveness on its clock: an agent is lost when nothing came from it
for ``heartbeat_timeout_s`` (controller.py). A controller that is itself late (its tick
loop held up: a slow ``state.json`` write under the lock, a long GC pause, a CPU hog
beside it) hears nobody meanwhile and would blame every node for its own silence. So the
time the controller was late does not count against the agents: :class:`Lateness`
measures the tick loop's lateness (each gap between two ticks beyond ``ALLOWANCE_S``)
and gives the *responsive* time between two moments, the wall time less the lateness
within it. Silence, the reconnect grace, the failure settle and the hang limit are judged
on it; overload then shows as latency (a lost node is noticed later), never as an
eviction.

Lateness is also recorded (:class:`OverloadRecorder`): a warning in the controller's log
with the lag, a ``controller_overload`` event in the run's event log (docs/SCHEMAS.md) and
the ``slurm_robust_controller_*`` metrics (docs/METRICS.md). A stand-still longer than
``frozen_s`` (controller.py) is no longer lateness but a frozen controller: its lease
lapses and a successor takes over (failover.py).
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_right
from collections.abc import Callable

# The controller's logger: the warning is about the controller, beside its other lines.
log = logging.getLogger("slurm_robust.launcher.control.controller")

#: A gap between two ticks up to this long is the loop's normal pace (its 0.05 s wait, a
#: tick's own work, the scheduler); what goes beyond is lateness.
ALLOWANCE_S = 0.25
#: Lateness of at least this much in one gap is an overload episode (logged, recorded).
EPISODE_S = 1.0
#: Episodes are logged and recorded at most once per this long (the worst meanwhile, and
#: how many), so that a controller overloaded for an hour writes a line every 10 s.
REPORT_EVERY_S = 10.0
#: Lateness intervals kept; the oldest half goes beyond (a judgment looks back a
#: heartbeat timeout or a hang limit, far fewer intervals than this).
KEEP = 4096
#: The fields' version in a ``controller_overload`` event (beside the record's ``v``).
OVERLOAD_VERSION = 1


class Lateness:
    """The tick loop's lateness over time (see the module docstring). Thread-safe: the
    loop beats, the connections' threads ask too."""

    def __init__(self, start: float, allowance_s: float = ALLOWANCE_S) -> None:
        self.allowance_s = allowance_s
        #: When the loop last ticked.
        self.last_beat = start
        self._starts: list[float] = []
        self._ends: list[float] = []
        #: Lateness in all up to the end of each interval (not rebased when pruned).
        self._cum: list[float] = []
        #: Lateness in all before the oldest interval kept.
        self._before = 0.0
        self._lock = threading.Lock()

    def beat(self, now: float) -> float:
        """The loop ticks at ``now``: the lateness of the gap since its previous tick."""
        with self._lock:
            late_from = self.last_beat + self.allowance_s
            self.last_beat = max(self.last_beat, now)
            if now <= late_from:
                return 0.0
            lag = now - late_from
            self._starts.append(late_from)
            self._ends.append(now)
            self._cum.append((self._cum[-1] if self._cum else self._before) + lag)
            if len(self._starts) > KEEP:
                cut = KEEP // 2
                self._before = self._cum[cut - 1]
                del self._starts[:cut], self._ends[:cut], self._cum[:cut]
            return lag

    def late_between(self, t0: float, t1: float) -> float:
        """Seconds the controller was late between ``t0`` and ``t1`` (the gap in progress
        counts: a loop stalled now is late now)."""
        if t1 <= t0:
            return 0.0
        with self._lock:
            return max(0.0, self._late_until(t1) - self._late_until(t0))

    def elapsed(self, since: float, now: float) -> float:
        """Responsive seconds from ``since`` to ``now``: the wall time less the lateness."""
        return max(0.0, (now - since) - self.late_between(since, now))

    def _late_until(self, t: float) -> float:
        i = bisect_right(self._starts, t)
        total = self._cum[i - 2] if i >= 2 else self._before
        if i >= 1:
            total += min(t, self._ends[i - 1]) - self._starts[i - 1]
        ongoing = self.last_beat + self.allowance_s
        if t > ongoing:
            total += t - ongoing
        return total


class OverloadRecorder:
    """Records the loop's lateness: log, event and metrics (see the module docstring).

    ``emit(fields, now)`` writes the event (the controller's event log); ``observe(lag,
    episode)`` feeds the metrics. Both are called from the tick loop, under its lock."""

    def __init__(self, emit: Callable[[dict[str, object], float], object],
                 observe: Callable[[float, bool], None] | None = None) -> None:
        self.emit, self.observe = emit, observe
        self._since: float | None = None  # first episode not yet recorded
        self._worst = 0.0
        self._episodes = 0
        self._late_s = 0.0
        self._last_report = -float("inf")
        #: Episodes recorded in all (for tests and the bench).
        self.episodes = 0
        self.worst = 0.0

    def note(self, lag: float, now: float, agents: int) -> None:
        """One gap's lateness (0: on time); records an episode at most every
        REPORT_EVERY_S."""
        if lag > 0 and self.observe is not None:
            self.observe(lag, lag >= EPISODE_S)
        if lag >= EPISODE_S:
            if self._since is None:
                self._since = now - lag
            self._worst = max(self._worst, lag)
            self._episodes += 1
            self._late_s += lag
            self.episodes += 1
            self.worst = max(self.worst, lag)
        if self._since is not None and now - self._last_report >= REPORT_EVERY_S:
            self._report(now, agents)

    def flush(self, now: float, agents: int) -> None:
        """Record the episodes held back by the period now (the run ends: nothing would
        record them later)."""
        if self._since is not None:
            self._report(now, agents)

    def _report(self, now: float, agents: int) -> None:
        assert self._since is not None
        log.warning("controller overloaded: its tick loop was %.1f s late (%d episode(s), "
                    "%.1f s late in all since %.1f s ago, %d agents); the agents' silence "
                    "over that time is not counted against them: lost nodes are noticed "
                    "later, none is blamed for it", self._worst, self._episodes,
                    self._late_s, now - self._since, agents)
        self.emit({"overload_version": OVERLOAD_VERSION, "lag_s": round(self._worst, 3),
                   "episodes": self._episodes, "late_s": round(self._late_s, 3),
                   "since": round(self._since, 3), "agents": agents}, now)
        self._last_report = now
        self._since, self._worst, self._episodes, self._late_s = None, 0.0, 0, 0.0
