"""Per-incident timings and losses, and incidents by class and by resolution.

Per incident (times in seconds; NaN where an input is unknown):

- ``time_to_detect`` = detected_at - fault_time
- ``time_to_localize`` = localized_at - detected_at
- ``time_to_recover`` = recovered_at - detected_at (recovered_at is when the first step
  after recovery finished, so this includes that one step)
- ``downtime_s`` = (recovered_at, or the run's end if never recovered) - (fault_time, or
  detected_at when the fault time is unknown)
- ``steps_lost``: as the incident record says; ``steps_redone`` and ``lost_work_s``: the
  unproductive step records (see :mod:`ettr`) attributed to this incident, i.e. the first
  incident of the run detected at or after the step finished, and their summed step time
- ``lost_time_s`` = downtime_s + lost_work_s

Tables by class (``category``, ``class``: ByteRobust Table 1) and by resolution
(``rung``: in_place, spare, requeue, stop) give count, share of all incidents, and mean
and max of each time. Shares sum to 1; per-group counts sum to the total.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from slurm_robust.analysis.taxonomy import CLASS_CATEGORY, CLASSES

TIME_COLUMNS = ("time_to_detect", "time_to_localize", "time_to_recover", "lost_time_s")


def incident_metrics(incidents: pd.DataFrame, unproductive: pd.DataFrame,
                     spans: pd.DataFrame) -> pd.DataFrame:
    """Add timing and loss columns to ``incidents``.

    ``unproductive``: step records with lost steps (run_id, time, lost_steps, lost_s, as
    the pipeline computes them); ``spans``: run wall spans from :func:`ettr.run_spans`.
    """
    inc = incidents.copy()
    origin = inc["fault_time"].fillna(inc["detected_at"])
    run_end = spans["end"].reindex(inc["run_id"].cat.codes.to_numpy()).to_numpy()
    inc["time_to_detect"] = inc["detected_at"] - inc["fault_time"]
    inc["time_to_localize"] = inc["localized_at"] - inc["detected_at"]
    inc["time_to_recover"] = inc["recovered_at"] - inc["detected_at"]
    inc["downtime_s"] = (inc["recovered_at"].fillna(pd.Series(run_end, index=inc.index))
                         - origin).clip(lower=0.0)
    redone, work = _attribute(inc, unproductive)
    inc["steps_redone"] = redone
    inc["lost_work_s"] = work
    inc["lost_time_s"] = inc["downtime_s"].fillna(0.0) + inc["lost_work_s"]
    return inc


def _attribute(inc: pd.DataFrame, lost: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    n = len(inc)
    if n == 0 or lost.empty:
        return np.zeros(n, dtype=np.int64), np.zeros(n)
    right = pd.DataFrame({"run": inc["run_id"].cat.codes.to_numpy(dtype=np.int64),
                          "detected_at": inc["detected_at"].to_numpy(),
                          "pos": np.arange(n)}).sort_values("detected_at", kind="stable")
    left = pd.DataFrame({"run": lost["run_id"].cat.codes.to_numpy(dtype=np.int64),
                         "time": lost["time"].to_numpy(),
                         "steps": lost["lost_steps"].to_numpy(dtype=np.float64),
                         "work": lost["lost_s"].to_numpy()}).sort_values("time")
    hit = pd.merge_asof(left, right, left_on="time", right_on="detected_at", by="run",
                        direction="forward").dropna(subset=["pos"])
    pos = hit["pos"].to_numpy(dtype=np.int64)
    return (np.bincount(pos, weights=hit["steps"].to_numpy(), minlength=n).astype(np.int64),
            np.bincount(pos, weights=hit["work"].to_numpy(), minlength=n))


def summarize_by(incidents: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Count, share and mean/max of each time per group of ``keys`` (observed groups)."""
    total = len(incidents)
    cols = [c for c in TIME_COLUMNS if c in incidents.columns]
    if total == 0:
        names = ["count", "share"] + [f"{s}_{c}" for c in cols for s in ("mean", "max")]
        return pd.DataFrame(columns=keys + names)
    grouped = incidents.groupby(keys, observed=True, sort=True)
    out = grouped.size().rename("count").to_frame()
    out["share"] = out["count"] / total
    stats = grouped[cols].agg(["mean", "max"])
    stats.columns = [f"{stat}_{col}" for col, stat in stats.columns]
    return out.join(stats).reset_index()


def by_class(incidents: pd.DataFrame) -> pd.DataFrame:
    """Incidents by category and class: every class of the taxonomy (ByteRobust Table 1
    and ours) by its own name, in table order, zero where it never occurred."""
    observed = summarize_by(incidents, ["category", "class"])
    full = pd.DataFrame({"category": [CLASS_CATEGORY[c] for c in CLASSES],
                         "class": list(CLASSES)})
    if len(observed):
        observed = observed.assign(category=observed["category"].astype(str),
                                   **{"class": observed["class"].astype(str)})
        out = full.merge(observed, on=["category", "class"], how="left")
    else:
        out = full.reindex(columns=["category", "class", *observed.columns[2:]])
    out["count"] = out["count"].fillna(0).astype(int)
    out["share"] = out["share"].fillna(0.0)
    return out


def by_category(incidents: pd.DataFrame) -> pd.DataFrame:
    """Incidents by category (explicit, implicit, manual)."""
    return summarize_by(incidents, ["category"])


def by_rung(incidents: pd.DataFrame) -> pd.DataFrame:
    """Incidents by resolution (in-place restart, spare, requeue, stop)."""
    return summarize_by(incidents, ["rung"])
