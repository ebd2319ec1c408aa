"""Reserve sizing: the quantile of simultaneous node failures (ByteRobust's rule).

The number of nodes that fail within one replacement window is modelled as
``X ~ Binomial(N, p)``: N nodes used by robust jobs, p the probability that one node fails
within a window. The target is the smallest k with ``P(X <= k) >= quantile``. With
p = 0.0012 this gives ByteRobust's table (Table 5): 2 spares for 128 and 256 nodes, 3 for
512, 4 for 1,024.

p comes from history when there is some: failures counted over ``history_h`` hours are
blended with the configured prior as a pseudo-count (``prior_weight`` node-windows at the
prior rate), so an empty history gives exactly the prior and a long history dominates it.
All functions here are pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from slurm_robust.errors import UsageError

# Summing pmf terms in log space keeps N in the tens of thousands exact enough; the
# epsilon absorbs float rounding so P(X <= k) = 0.99 exactly is not missed by 1e-16.
_EPS = 1e-12


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        log_term = (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                    + i * log_p + (n - i) * log_q)
        total += math.exp(log_term)
    return min(total, 1.0)


def binomial_quantile(n: int, p: float, quantile: float = 0.99) -> int:
    """Smallest k with P(X <= k) >= quantile, X ~ Binomial(n, p).

    Raises:
        UsageError: n < 0, p outside [0, 1], or quantile outside (0, 1).
    """
    if n < 0:
        raise UsageError(f"--nodes must be >= 0, got {n}")
    if not 0.0 <= p <= 1.0:
        raise UsageError(f"--failure-prob must be in [0, 1], got {p}")
    if not 0.0 < quantile < 1.0:
        raise UsageError(f"--quantile must be in (0, 1), got {quantile}")
    if p == 0.0 or n == 0:
        return 0
    if p == 1.0:
        return n
    cdf = 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    for k in range(n + 1):
        cdf += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                        + k * log_p + (n - k) * log_q)
        if cdf + _EPS >= quantile:
            return k
    return n


@dataclass(frozen=True)
class FailureEstimate:
    """A per-node, per-window failure probability and where it came from."""

    p: float
    failures: int
    node_windows: float
    prior: float
    prior_weight: float
    source: str  # "prior" (no history) or "history+prior"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_failure_prob(failure_times: Iterable[float], nodes: int, now: float,
                          history_h: float, window_h: float, prior: float,
                          prior_weight: float) -> FailureEstimate:
    """Blend failures seen in the last ``history_h`` hours with the prior.

    ``failure_times`` are the times of distinct node failures (one per node per incident).
    Exposure is ``nodes * history_h / window_h`` node-windows. The estimate is
    ``(failures + prior * prior_weight) / (exposure + prior_weight)``, capped at 1.
    """
    since = now - history_h * 3600.0
    failures = sum(1 for t in failure_times if since <= t <= now)
    exposure = max(nodes, 0) * history_h / window_h
    if failures == 0 and exposure == 0:
        return FailureEstimate(prior, 0, 0.0, prior, prior_weight, "prior")
    p = min((failures + prior * prior_weight) / (exposure + prior_weight), 1.0)
    return FailureEstimate(p, failures, exposure, prior, prior_weight, "history+prior")


@dataclass(frozen=True)
class Target:
    """The reserve's target size and the numbers behind it."""

    size: int
    nodes: int
    p: float
    quantile: float
    computed: int
    fixed: bool
    min_target: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reserve_target(nodes: int, p: float, quantile: float, fixed: int | None,
                   min_target: int) -> Target:
    """The target size: the fixed one if configured, else max(min_target, quantile)."""
    computed = binomial_quantile(nodes, p, quantile)
    size = fixed if fixed is not None else max(min_target, computed)
    return Target(size, nodes, p, quantile, computed, fixed is not None, min_target)
