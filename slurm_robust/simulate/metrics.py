"""ETTR (cumulative and 1-hour sliding), the downtime split, and the run summary.

Definitions follow the report's (analysis/ettr.py, after ByteRobust section 8): productive
time is the time of the steps that were kept (every step is checkpointed, so every
finished step is kept), wall time is the simulated horizon, cumulative ETTR their
ratio; the sliding ETTR at t is the productive share of [t - 1 h, t], on a 1-minute grid.
Downtime is split as the paper's Figure 3: detection (fault to detected), localisation
(detected to localized), failover (localized to training resumed: restart, spare,
requeue with queue wait, or resubmission) and recompute (the step in flight at the fault).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from slurm_robust.vocabulary import RUNGS, Rung

if TYPE_CHECKING:
    from slurm_robust.simulate.results import IncidentResult

WINDOW_S = 3600.0
GRID_S = 60.0


def productive_curve(segments: Sequence[tuple[float, int]], step_s: float,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints of cumulative productive time against wall time."""
    xs, ys = [0.0], [0.0]
    total = 0.0
    for start, steps in segments:
        if steps <= 0:
            continue
        xs += [start, start + steps * step_s]
        ys += [total, total + steps * step_s]
        total += steps * step_s
    return np.asarray(xs), np.asarray(ys)


def sliding_ettr(segments: Sequence[tuple[float, int]], step_s: float, end: float,
                 window_s: float = WINDOW_S, grid_s: float = GRID_S) -> np.ndarray:
    """ETTR over [t - window, t] for t on the grid from ``window`` to ``end``."""
    xs, ys = productive_curve(segments, step_s)
    if end < window_s:
        return np.asarray([float(np.interp(end, xs, ys)) / end]) if end > 0 else np.zeros(0)
    t = np.arange(window_s, end + 1e-9, grid_s)
    done = np.interp(t, xs, ys) - np.interp(t - window_s, xs, ys)
    return np.clip(done / window_s, 0.0, 1.0)


def _integral(levels: Sequence[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t0, n), (t1, _) in zip(levels, [*levels[1:], (end, 0)], strict=True):
        total += n * max(min(t1, end) - t0, 0.0)
    return total


def summarize(incidents: Sequence[IncidentResult], segments: Sequence[tuple[float, int]],
              step_s: float, end: float, machines: int,
              spare_level: Sequence[tuple[float, int]],
              reserve_level: Sequence[tuple[float, int]]) -> dict[str, Any]:
    productive = sum(s for _, s in segments) * step_s
    slide = sliding_ettr(segments, step_s, end)
    split = {"detection": 0.0, "localisation": 0.0, "failover": 0.0, "recompute": 0.0}
    evict_failover: list[float] = []
    for r in incidents:
        det, loc = min(r.detected, end), min(r.localized, end)
        rec = end if r.recovered is None else min(r.recovered, end)
        split["detection"] += det - min(r.fault, end)
        split["localisation"] += loc - det
        split["failover"] += rec - loc
        split["recompute"] += r.lost_s
        if r.rung in (Rung.SPARE, Rung.REQUEUE) and r.recovered is not None:
            evict_failover.append(r.recovered - r.localized)
    job_machine_s = machines * end
    spare_s = _integral(spare_level, end)
    reserve_s = _integral(reserve_level, end)
    return {
        "wall_s": end, "productive_s": productive,
        "ettr": productive / end if end > 0 else 0.0,
        "sliding_ettr_min": float(slide.min()) if slide.size else None,
        "sliding_ettr_p01": float(np.quantile(slide, 0.01)) if slide.size else None,
        "max_unproductive_min_per_hour": (float((1 - slide.min()) * WINDOW_S / 60)
                                          if slide.size else None),
        "downtime_s": {k: round(v, 3) for k, v in split.items()},
        "incidents": len(incidents),
        "by_rung": {rung: sum(1 for r in incidents if r.rung == rung) for rung in RUNGS},
        "by_class": _count(r.cls for r in incidents),
        "evicting_failover_mean_s": (float(np.mean(evict_failover))
                                     if evict_failover else None),
        "evicting_incidents": len(evict_failover),
        "queue_wait_s": round(sum(r.queue_wait_s for r in incidents), 3),
        "spare_machine_days": spare_s / 86400.0,
        "reserve_machine_days": reserve_s / 86400.0,
        "spare_cost_pct": 100.0 * (spare_s + reserve_s) / job_machine_s if end else 0.0,
        "reserve_mean": reserve_s / end if end else 0.0,
        "reserve_min": min(n for _, n in reserve_level),
        "reserve_empty_pct": 100.0 * _time_at_zero(reserve_level, end) / end if end else 0.0,
    }


def _time_at_zero(levels: Sequence[tuple[float, int]], end: float) -> float:
    total = 0.0
    for (t0, n), (t1, _) in zip(levels, [*levels[1:], (end, 0)], strict=True):
        if n == 0:
            total += max(min(t1, end) - t0, 0.0)
    return total


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
