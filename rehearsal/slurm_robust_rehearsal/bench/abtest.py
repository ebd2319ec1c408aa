"""Overheads on a noisy machine: interleaved rounds, per-round ratios, and their spread.

A busy 2-core machine drifts by more than a 2 % effect over a few seconds, so "mean of all
A runs, then mean of all B runs" measures the drift. Instead every round runs each arm
once, in an order shuffled per round (seeded), and the figure is the *per-round* ratio
``arm / baseline - 1``: both sides of one ratio saw the same moment's load. Over the
rounds we report the median, the interquartile range and min..max, and a verdict:

- ``within noise`` when min..max covers zero (the machine cannot tell the arms apart);
- ``slower`` / ``faster`` when every round agrees on the sign.

A target such as "overhead <= 2 %" is ``met`` only when even the worst round is within it
(a skeptic's reading: a median inside the target with rounds far outside it proves
nothing); ``met_median`` says whether the median alone is.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    WITHIN_NOISE = "within noise"
    SLOWER = "slower"
    FASTER = "faster"


@dataclass(frozen=True)
class RatioSummary:
    """Spread of the per-round ``arm / baseline - 1`` over the counted rounds."""

    rounds: int
    median: float
    q1: float
    q3: float
    min: float
    max: float
    verdict: Verdict
    per_round: tuple[float, ...]

    def as_dict(self, target_max: float | None = None) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.value
        out["per_round"] = [round(x, 5) for x in self.per_round]
        for key in ("median", "q1", "q3", "min", "max"):
            out[key] = round(out[key], 5)
        if target_max is not None:
            out["target_max"] = target_max
            out["met"] = self.max <= target_max
            out["met_median"] = self.median <= target_max
        return out


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, IQR and min..max of a figure measured once per round."""
    if not values:
        raise ValueError("no values to summarise")
    vals = list(values)
    q1, _, q3 = (statistics.quantiles(vals, n=4, method="inclusive") if len(vals) >= 2
                 else (vals[0], vals[0], vals[0]))
    return {"rounds": len(vals), "median": round(statistics.median(vals), 4),
            "q1": round(q1, 4), "q3": round(q3, 4), "min": round(min(vals), 4),
            "max": round(max(vals), 4), "per_round": [round(v, 4) for v in vals]}


def round_order(arms: Sequence[str], round_no: int, seed: int = 0) -> list[str]:
    """The arms in this round's order: a seeded shuffle, the same on every rank."""
    order = list(arms)
    random.Random(seed * 1_000_003 + round_no).shuffle(order)
    return order


def summarise(baseline: Sequence[float], arm: Sequence[float]) -> RatioSummary:
    """Per-round ratios of ``arm`` to ``baseline`` (equal lengths, round by round)."""
    if len(baseline) != len(arm) or not baseline:
        raise ValueError(f"need the same positive number of rounds for both arms, got "
                         f"{len(baseline)} and {len(arm)}")
    if min(baseline) <= 0:
        raise ValueError("baseline times must be positive")
    ratios = [b / a - 1.0 for a, b in zip(baseline, arm, strict=True)]
    if len(ratios) >= 2:
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    else:
        q1 = q3 = ratios[0]
    lo, hi = min(ratios), max(ratios)
    if lo <= 0.0 <= hi:
        verdict = Verdict.WITHIN_NOISE
    else:
        verdict = Verdict.SLOWER if lo > 0 else Verdict.FASTER
    return RatioSummary(rounds=len(ratios), median=statistics.median(ratios), q1=q1, q3=q3,
                        min=lo, max=hi, verdict=verdict, per_round=tuple(ratios))


def run_rounds(arms: dict[str, Callable[[], float]], rounds: int, warmup: int = 1,
               seed: int = 0) -> dict[str, list[float]]:
    """Run every arm once per round in a shuffled order; returns each arm's timings.

    Each callable returns the figure it measured (seconds, usually). The first
    ``warmup`` rounds run but are not kept (allocation, page faults, imports).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    out: dict[str, list[float]] = {name: [] for name in arms}
    for rnd in range(warmup + rounds):
        for name in round_order(list(arms), rnd, seed):
            value = arms[name]()
            if rnd >= warmup:
                out[name].append(value)
    return out


def compare(timings: dict[str, Sequence[float]], baseline: str,
            targets: dict[str, float] | None = None) -> dict[str, Any]:
    """Every arm against ``baseline``: summaries as dicts (with targets where given)."""
    targets = targets or {}
    return {name: summarise(timings[baseline], values).as_dict(targets.get(name))
            for name, values in timings.items() if name != baseline}
