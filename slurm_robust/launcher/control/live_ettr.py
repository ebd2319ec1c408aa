"""ETTR computed live by the controller: O(1) amortised per step, no pandas.

Same definition as :mod:`slurm_robust.analysis.ettr` (productive step time over wall
time), maintained incrementally:

- every finished step adds its ``step_time_s`` to the productive total and to a window
  of the last ``window_s`` seconds (a deque of ``(finished_at, step, seconds)``);
- a rollback to ``restored_step`` undoes the steps after it: they are popped from the
  deque's right end (they are the newest) and subtracted from both totals, so redone
  work is counted once, as in the offline definition;
- the first step of an attempt has no step time (its wall time holds the restart); the
  offline analysis gives it the run's median, here the previous step's time (a running
  median is not O(1)).

Differences from the offline figure, by design: wall time starts when this controller
started (an allocation after a requeue starts over), and a rollback further back than
the window cannot undo steps already dropped from it (the cumulative figure then
overstates by at most those steps). Not thread-safe: the owner holds its lock.
"""

from __future__ import annotations

from collections import deque

DEFAULT_WINDOW_S = 3600.0


class LiveEttr:
    """Cumulative and sliding-window ETTR of one run (see the module docstring)."""

    def __init__(self, started_at: float, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.started_at = started_at
        self.window_s = window_s
        self.productive_s = 0.0
        self._window: deque[tuple[float, int, float]] = deque()
        self._window_s = 0.0
        self._last_dt: float | None = None

    def step(self, step: int, step_time_s: float | None, finished_at: float) -> None:
        dt = step_time_s if step_time_s is not None else self._last_dt
        if dt is None:
            return  # the very first step: nothing to compare with, counted as not known
        dt = max(0.0, float(dt))
        self._last_dt = dt
        self.productive_s += dt
        self._window.append((finished_at, step, dt))
        self._window_s += dt
        self._expire(finished_at)

    def rollback(self, restored_step: int | None) -> None:
        """Undo the steps after ``restored_step`` (None: everything in the window)."""
        floor = -1 if restored_step is None else restored_step
        while self._window and self._window[-1][1] > floor:
            _, _, dt = self._window.pop()
            self.productive_s -= dt
            self._window_s -= dt

    def cumulative(self, now: float) -> float:
        wall = now - self.started_at
        return _ratio(self.productive_s, wall)

    def windowed(self, now: float) -> float:
        self._expire(now)
        wall = min(self.window_s, now - self.started_at)
        return _ratio(self._window_s, wall)

    def _expire(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._window and self._window[0][0] < cutoff:
            self._window_s -= self._window.popleft()[2]
        if not self._window:
            self._window_s = 0.0  # no float drift left behind by many add/subtract pairs


def _ratio(productive: float, wall: float) -> float:
    if wall <= 0:
        return 0.0
    # Clock skew between nodes can make step times sum past the wall time; the offline
    # definition takes a union of intervals for the same reason. Clip to [0, 1].
    return min(1.0, max(0.0, productive / wall))
