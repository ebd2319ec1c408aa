"""Fail-slow detection: flag the slowest ranks' group each round, evict by vote.

ByteRobust (section 3 of the ByteRobust paper cited in README.md): aggregate every 10 s,
flag the group with the most outliers, and evict the group flagged most over 5 rounds.

Input: per-rank step timings reported by the training API. In synchronous training the
wall time of a step is the same on every rank (everyone waits for the slowest inside
the collectives), so the training API reports each rank's *busy* time: the step's time
outside collective waits (forward, backward, optimizer, data). A slow machine shows a
larger busy time on its ranks; the healthy ranks show more waiting instead.

Each round takes, per rank, the median of its samples in the interval; a rank is slow
when that is above ``slow_factor`` times the median over ranks (and above it by at
least ``min_excess_s``). Slowness shared by most ranks moves the median with it, so
uniform slowness flags nothing. The slow ranks go through the same group rule as the
hang analyzer (:func:`~slurm_robust.stacks.groups.select_eviction`). A group flagged in
at least ``min_votes`` of the last ``window`` rounds, and more often than any other, is
named for eviction.

Everything here is pure given the clock passed in, so tests drive it with synthetic
timings and a fake ``now``.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.layout import ParallelLayout
from slurm_robust.stacks.groups import Eviction, select_eviction


@dataclass(frozen=True)
class FailSlowOptions:
    """Thresholds of the fail-slow vote (ByteRobust's values are the defaults).

    interval_s: seconds between rounds.
    window: rounds the vote looks back over.
    min_votes: flags a group needs within the window to be evicted.
    slow_factor: a rank is slow above this multiple of the median busy time.
    min_excess_s: and at least this many seconds above it (ignores jitter on tiny steps).
    max_slow_fraction: a round with more slow ranks than this share flags nothing
        (that is not one fault).
    min_reporting: share of ranks that must report in a round for it to count.
    single_rank_dim: the group evicted for one slow rank.
    warmup_samples: each rank's first samples in a monitor's life that are not counted
        (the first steps of a generation: compilation, allocator and cache warm-up take
        each rank a different time, and once flagged a healthy rank of three).
    """

    interval_s: float = 10.0
    window: int = 5
    min_votes: int = 3
    slow_factor: float = 1.5
    min_excess_s: float = 0.0
    max_slow_fraction: float = 0.25
    min_reporting: float = 0.5
    single_rank_dim: str = "pp"
    warmup_samples: int = 2

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.window < 1:
            raise UsageError("fail-slow: interval_s must be > 0 and window >= 1")
        if not 1 <= self.min_votes <= self.window:
            raise UsageError(f"fail-slow: min_votes must be in 1..window ({self.window}), "
                             f"got {self.min_votes}")
        if self.slow_factor <= 1:
            raise UsageError(f"fail-slow: slow_factor must be > 1, got {self.slow_factor}")
        if self.warmup_samples < 0:
            raise UsageError(f"fail-slow: warmup_samples must be >= 0, got "
                             f"{self.warmup_samples}")
        if not self.min_excess_s >= 0:
            raise UsageError(f"fail-slow: min_excess_s must be >= 0 s, got "
                             f"{self.min_excess_s}")
        if not 0 < self.max_slow_fraction < 1 or not 0 < self.min_reporting <= 1:
            raise UsageError("fail-slow: max_slow_fraction must be in (0, 1) and "
                             "min_reporting in (0, 1]")


@dataclass(frozen=True)
class RoundResult:
    """One round: the median busy time, the slow ranks and the group flagged (if any)."""

    time: float
    ranks_reporting: int
    median_s: float | None
    slow_ranks: tuple[int, ...]
    flagged: Eviction | None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "ranks_reporting": self.ranks_reporting,
                "median_s": self.median_s, "slow_ranks": list(self.slow_ranks),
                "flagged": self.flagged.key if self.flagged else None, "note": self.note}


@dataclass(frozen=True)
class FailSlowDecision:
    """A group to evict, with the votes and rounds behind it."""

    eviction: Eviction
    votes: dict[str, int]
    rounds: tuple[RoundResult, ...]

    def evidence(self) -> dict[str, Any]:
        return {"eviction": self.eviction.to_json(), "votes": self.votes,
                "rounds": [r.to_json() for r in self.rounds]}


def flag_round(busy: Mapping[int, float], layout: ParallelLayout, options: FailSlowOptions,
               now: float = 0.0, node_of: Callable[[int], str] | None = None) -> RoundResult:
    """Decide one round from ``{rank: busy seconds}`` (one value per reporting rank)."""
    if len(busy) < options.min_reporting * layout.world_size or not busy:
        return RoundResult(now, len(busy), None, (), None,
                           f"only {len(busy)} of {layout.world_size} ranks reported")
    median = statistics.median(busy.values())
    slow = tuple(sorted(r for r, t in busy.items()
                        if t > options.slow_factor * median
                        and t - median >= options.min_excess_s))
    if not slow:
        return RoundResult(now, len(busy), median, (), None, "no rank above the threshold")
    if len(slow) > options.max_slow_fraction * len(busy):
        return RoundResult(now, len(busy), median, slow, None,
                           f"{len(slow)} slow ranks: too many for one fault")
    eviction = select_eviction(slow, layout, node_of, options.single_rank_dim)
    return RoundResult(now, len(busy), median, slow, eviction)


def vote(rounds: Sequence[RoundResult], options: FailSlowOptions) -> FailSlowDecision | None:
    """The group flagged most over the last ``window`` rounds, if it has enough votes.

    A tie for the most votes names nothing (the evidence does not single out a group).
    """
    recent = tuple(rounds)[-options.window:]
    counts = Counter(r.flagged.key for r in recent if r.flagged is not None)
    if not counts:
        return None
    ranked = counts.most_common()
    key, top = ranked[0]
    if top < options.min_votes or (len(ranked) > 1 and ranked[1][1] == top):
        return None
    eviction = next(r.flagged for r in reversed(recent)
                    if r.flagged is not None and r.flagged.key == key)
    return FailSlowDecision(eviction, dict(counts), recent)


@dataclass
class FailSlowMonitor:
    """Collects per-rank timings and runs a round every ``interval_s``.

    Call :meth:`record` for each timing the training API reports and :meth:`poll`
    regularly; ``poll`` returns a decision when the vote names a group, then starts
    a fresh vote (the group is about to be evicted).
    """

    layout: ParallelLayout
    options: FailSlowOptions = field(default_factory=FailSlowOptions)
    node_of: Callable[[int], str] | None = None
    started: float | None = None
    rounds: deque[RoundResult] = field(init=False)
    _samples: dict[int, list[float]] = field(default_factory=dict, init=False)
    _seen: Counter[int] = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        self.rounds = deque(maxlen=self.options.window)

    def record(self, rank: int, busy_s: float, now: float) -> None:
        self.layout.check_rank(rank)
        self._seen[rank] += 1
        if self._seen[rank] <= self.options.warmup_samples:
            return
        if self.started is None:
            self.started = now
        self._samples.setdefault(rank, []).append(busy_s)

    def poll(self, now: float) -> FailSlowDecision | None:
        if self.started is None or now - self.started < self.options.interval_s:
            return None
        busy = {r: statistics.median(v) for r, v in self._samples.items() if v}
        self._samples = {}
        self.started = now
        self.rounds.append(flag_round(busy, self.layout, self.options, now, self.node_of))
        decision = vote(self.rounds, self.options)
        if decision is not None:
            self.rounds.clear()
        return decision
