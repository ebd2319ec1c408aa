"""Time distributions for detection, localisation and recovery, drawn with numpy.

A distribution is written in failure-mix and recovery-time files as a JSON object:
``{"dist": "fixed", "s": 10}``, ``{"dist": "exp", "mean": 93, "max": 600}`` (exponential,
cut at ``max`` when given), ``{"dist": "uniform", "lo": 0, "hi": 10}`` or
``{"dist": "empirical", "values": [...]}`` (resampled, as measured runs give).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slurm_robust.errors import UsageError

KINDS = ("fixed", "exp", "uniform", "empirical")


@dataclass(frozen=True)
class Dist:
    """One non-negative duration distribution, in seconds."""

    kind: str
    a: float = 0.0  # fixed: value; exp: mean; uniform: lo
    b: float = 0.0  # exp: cap (0 = none); uniform: hi
    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"distribution kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.a < 0 or self.b < 0 or any(v < 0 for v in self.values):
            raise UsageError(f"distribution {self.describe()}: durations must be >= 0")
        if self.kind == "uniform" and self.b < self.a:
            raise UsageError(f"uniform distribution needs lo <= hi, got {self.a} > {self.b}")
        if self.kind == "empirical" and not self.values:
            raise UsageError("empirical distribution needs at least one value")

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "exp":
            x = float(rng.exponential(self.a)) if self.a > 0 else 0.0
            return min(x, self.b) if self.b > 0 else x
        if self.kind == "uniform":
            return float(rng.uniform(self.a, self.b))
        return float(self.values[int(rng.integers(len(self.values)))])

    @property
    def mean(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "exp":
            # E[min(X, c)] = m (1 - exp(-c/m)) for an exponential X of mean m.
            return self.a * (1 - np.exp(-self.b / self.a)) if self.b > 0 and self.a > 0 \
                else self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        return float(np.mean(self.values))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g} s"
        if self.kind == "exp":
            return f"exp(mean {self.a:g} s" + (f", max {self.b:g} s)" if self.b else ")")
        if self.kind == "uniform":
            return f"uniform({self.a:g}..{self.b:g} s)"
        return f"empirical({len(self.values)} values, mean {self.mean:.1f} s)"

    def to_json(self) -> dict[str, Any]:
        if self.kind == "fixed":
            return {"dist": "fixed", "s": self.a}
        if self.kind == "exp":
            return {"dist": "exp", "mean": self.a, **({"max": self.b} if self.b else {})}
        if self.kind == "uniform":
            return {"dist": "uniform", "lo": self.a, "hi": self.b}
        return {"dist": "empirical", "values": list(self.values)}


def fixed(s: float) -> Dist:
    return Dist("fixed", float(s))


def exp(mean: float, cap: float = 0.0) -> Dist:
    return Dist("exp", float(mean), float(cap))


def parse(obj: Any, where: str) -> Dist:
    """A Dist from its JSON form (a bare number is a fixed duration)."""
    if isinstance(obj, bool):
        raise UsageError(f"{where}: a duration must be a number or a distribution object")
    if isinstance(obj, int | float):
        return fixed(obj)
    if not isinstance(obj, dict) or "dist" not in obj:
        raise UsageError(f"{where}: expected a number or an object with \"dist\" "
                         f"({', '.join(KINDS)}), got {obj!r:.80}")
    kind = obj["dist"]
    try:
        if kind == "fixed":
            return fixed(float(obj["s"]))
        if kind == "exp":
            return exp(float(obj["mean"]), float(obj.get("max", 0.0)))
        if kind == "uniform":
            return Dist("uniform", float(obj["lo"]), float(obj["hi"]))
        if kind == "empirical":
            return Dist("empirical", values=tuple(float(v) for v in obj["values"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{where}: bad {kind!r} distribution {obj!r:.80} ({exc})") from exc
    raise UsageError(f"{where}: distribution kind {kind!r}: use one of {', '.join(KINDS)}")
