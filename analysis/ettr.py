"""Effective training time ratio (ETTR), cumulative and over a sliding window.

Definitions (ByteRobust §8 after Kokolis et al., Meta's "Revisiting Reliability"):

- **Wall time** of a run: from its first ``run_start`` record to its last ``run_end``
  record (a run without them: its first and last event), clipped to ``[since, until]``.
  Time spent pending between a requeue and the next attempt is wall time.
- **Step execution interval**: a step record finished at ``time`` and took
  ``step_time_s``, so it covers ``[time - step_time_s, time]``.
- **Kept step**: a step record is *unproductive* when a later rollback undid it: some
  rollback at ``cutoff > time`` restored a state older than the step (``restored_step
  < step``). Rollbacks are every ``attempt_start`` after the run's first attempt (cutoff:
  its time; ``restored_step`` null means it started from scratch) and every incident
  with a ``restored_step`` (cutoff: ``detected_at``). All other step records are kept.
  So steps finished after the restored step but before the fault are redone and are not
  productive; the redone copies, finished after the rollback, are.
- **Productive time**: the length of the union of the kept steps' execution intervals,
  clipped to the wall span. For sequential steps this is exactly the sum of the kept
  steps' ``step_time_s``; taking the union (rather than the sum) keeps ETTR within
  [0, 1] even if step times overlap through clock skew or duplicate records.
  We chose step time over "wall time between kept step completions" because the gap
  before the first step of an attempt holds restart and restore time, which is not
  productive, and because each record then carries its own duration (gaps in the log do
  not inflate productive time).
- **Cumulative ETTR** = productive time / wall time (per run, and over all runs as
  sum of productive / sum of wall).
- **Sliding-window ETTR** at ``t`` = productive time in ``[t - W, t]`` / the part of that
  window inside the run (default W = 1 h), evaluated every ``every_s`` seconds from the
  run's start, and at its end. A window with no kept step has ETTR 0.

Step records are first reduced to one per (run, attempt, step): the all-ranks record
(``rank`` null) when there is one, else the slowest rank's (max time and step time).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from slurm_robust.analysis.loaders import RunLog

DEFAULT_WINDOW_S = 3600.0
_KEY = ["run_id", "attempt", "step"]


def dedup_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """One record per (run, attempt, step), as the module docstring says."""
    cols = ["run_id", "job_id", "attempt", "step", "time", "step_time_s", "loss"]
    whole = steps.loc[steps["rank"].isna(), cols]
    ranked = steps.loc[steps["rank"].notna()]
    whole = whole.drop_duplicates(_KEY, keep="last")
    if ranked.empty:
        return whole.reset_index(drop=True)
    per_rank = ranked.groupby(_KEY, observed=True, sort=False).agg(
        job_id=("job_id", "first"), time=("time", "max"), step_time_s=("step_time_s", "max"),
        loss=("loss", "mean")).reset_index()
    keys = pd.MultiIndex.from_frame(whole[_KEY].astype({"run_id": object}))
    other = pd.MultiIndex.from_frame(per_rank[_KEY].astype({"run_id": object}))
    per_rank = per_rank[~other.isin(keys)]
    out = pd.concat([whole, per_rank[cols]], ignore_index=True)
    out["run_id"] = out["run_id"].astype(steps["run_id"].dtype)
    return out


def rollbacks(log: RunLog) -> pd.DataFrame:
    """Rollback points per run: run_id, cutoff, restored (-1 = from scratch)."""
    att = log.attempts
    first = att.groupby("run_id", observed=True)["attempt"].transform("min")
    later = att[att["attempt"] > first]
    from_attempts = pd.DataFrame({
        "run_id": later["run_id"].astype(object), "cutoff": later["time"],
        "restored": later["restored_step"].fillna(-1).astype("int64")})
    inc = log.incidents[log.incidents["restored_step"].notna()]
    from_incidents = pd.DataFrame({
        "run_id": inc["run_id"].astype(object), "cutoff": inc["detected_at"],
        "restored": inc["restored_step"].astype("int64")})
    out = pd.concat([from_attempts, from_incidents], ignore_index=True)
    return out.astype({"cutoff": "float64", "restored": "int64"})


def mark_kept(steps: pd.DataFrame, points: pd.DataFrame) -> pd.Series:
    """Boolean Series (aligned to ``steps``): True for kept step records."""
    if points.empty or steps.empty:
        return pd.Series(True, index=steps.index)
    pts = points.sort_values(["run_id", "cutoff"], ascending=[True, False], kind="stable")
    # The smallest restored step among this and every later rollback of the run.
    pts = pts.assign(later_min=pts.groupby("run_id", sort=False)["restored"].cummin())
    pts = pts.sort_values("cutoff", kind="stable")
    left = pd.DataFrame({"run_id": steps["run_id"].astype(object).to_numpy(),
                         "time": steps["time"].to_numpy(), "step": steps["step"].to_numpy(),
                         "pos": np.arange(len(steps))}).sort_values("time", kind="stable")
    hit = pd.merge_asof(left, pts[["run_id", "cutoff", "later_min"]], left_on="time",
                        right_on="cutoff", by="run_id", direction="forward",
                        allow_exact_matches=False)
    lost = hit["later_min"].notna().to_numpy() & (hit["step"].to_numpy()
                                                  > hit["later_min"].fillna(0).to_numpy())
    kept = np.ones(len(steps), dtype=bool)
    kept[hit["pos"].to_numpy()] = ~lost
    return pd.Series(kept, index=steps.index)


def run_spans(log: RunLog, since: float | None = None,
              until: float | None = None) -> pd.DataFrame:
    """Wall span per run (index run_id as str): start, end, wall_s."""
    parts = [f[["run_id", "time"]] for f in (log.runs, log.attempts, log.steps,
                                              log.incidents, log.ends) if not f.empty]
    if not parts:
        return pd.DataFrame({"start": [], "end": [], "wall_s": []},
                            index=pd.Index([], name="run_id", dtype=object))
    every = pd.concat([p.astype({"run_id": object}) for p in parts], ignore_index=True)
    first = every.groupby("run_id")["time"].min()
    last = every.groupby("run_id")["time"].max()
    began = log.runs.astype({"run_id": object}).groupby("run_id")["time"].min()
    ended = log.ends.astype({"run_id": object}).groupby("run_id")["time"].max()
    start = began.reindex(first.index).fillna(first)
    end = ended.reindex(first.index).fillna(last)
    if since is not None:
        start = start.clip(lower=since)
    if until is not None:
        end = end.clip(upper=until)
    end = np.maximum(end, start)
    spans = pd.DataFrame({"start": start, "end": end, "wall_s": end - start})
    spans.index.name = "run_id"
    return spans


def productive_intervals(steps: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Disjoint productive intervals per run: run_id, a, b, cum (length through this one).

    ``steps`` must hold only kept records.
    """
    run = steps["run_id"].astype(object).to_numpy()
    span = spans.reindex(run)
    a = np.maximum(steps["time"].to_numpy() - steps["step_time_s"].to_numpy(),
                   span["start"].to_numpy())
    b = np.minimum(steps["time"].to_numpy(), span["end"].to_numpy())
    iv = pd.DataFrame({"run_id": run, "a": a, "b": b}).dropna()
    iv = iv[iv["b"] > iv["a"]].sort_values(["run_id", "a"], kind="stable")
    # Union: each interval adds only what lies beyond the latest end seen before it.
    prev_end = iv.groupby("run_id", sort=False)["b"].cummax()
    prev_end = prev_end.groupby(iv["run_id"], sort=False).shift(1)
    a_clip = np.maximum(iv["a"].to_numpy(), prev_end.fillna(-np.inf).to_numpy())
    iv = iv.assign(a=a_clip)
    iv = iv[iv["b"] > iv["a"]]
    cum = (iv["b"] - iv["a"]).groupby(iv["run_id"], sort=False).cumsum()
    return iv.assign(cum=cum).reset_index(drop=True)


def productive_before(intervals: pd.DataFrame, run_ids: np.ndarray,
                      times: np.ndarray) -> np.ndarray:
    """P(t): productive seconds of run ``run_ids[i]`` before ``times[i]``."""
    if len(times) == 0:
        return np.zeros(0)
    q = pd.DataFrame({"run_id": run_ids, "t": np.asarray(times, dtype=np.float64),
                      "pos": np.arange(len(times))}).sort_values("t", kind="stable")
    if intervals.empty:
        return np.zeros(len(times))
    right = intervals.sort_values("a", kind="stable")
    hit = pd.merge_asof(q, right, left_on="t", right_on="a", by="run_id",
                        direction="backward", allow_exact_matches=False)
    over = np.maximum(hit["b"].to_numpy() - hit["t"].to_numpy(), 0.0)
    value = np.nan_to_num(hit["cum"].to_numpy() - over, nan=0.0)
    out = np.empty(len(times))
    out[hit["pos"].to_numpy()] = value
    return out


def cumulative_ettr(intervals: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Per run: wall_s, productive_s, unproductive_s, ettr (NaN for a zero-length run)."""
    productive = (intervals["b"] - intervals["a"]).groupby(intervals["run_id"]).sum()
    out = spans[["wall_s"]].copy()
    out["productive_s"] = productive.reindex(out.index).fillna(0.0)
    out["unproductive_s"] = out["wall_s"] - out["productive_s"]
    with np.errstate(invalid="ignore", divide="ignore"):
        out["ettr"] = np.where(out["wall_s"] > 0, out["productive_s"] / out["wall_s"], np.nan)
    return out


def overall_ettr(per_run: pd.DataFrame) -> float:
    """Sum of productive time over sum of wall time (NaN when there is no wall time)."""
    wall = float(per_run["wall_s"].sum())
    return float(per_run["productive_s"].sum() / wall) if wall > 0 else float("nan")


def sliding_ettr(intervals: pd.DataFrame, spans: pd.DataFrame,
                 window_s: float = DEFAULT_WINDOW_S, every_s: float | None = None,
                 ) -> pd.DataFrame:
    """Window and cumulative ETTR on a grid: run_id, time, window_ettr, cumulative_ettr."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    every = float(every_s if every_s is not None else window_s / 12)
    live = spans[spans["wall_s"] > 0]
    counts = np.ceil(live["wall_s"].to_numpy() / every).astype(np.int64)
    starts = np.repeat(live["start"].to_numpy(), counts)
    ends = np.repeat(live["end"].to_numpy(), counts)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    k = np.arange(counts.sum()) - offsets + 1
    t = np.minimum(starts + k * every, ends)
    runs = np.repeat(live.index.to_numpy(dtype=object), counts)
    lo = np.maximum(t - window_s, starts)
    p_t = productive_before(intervals, runs, t)
    p_lo = productive_before(intervals, runs, lo)
    return pd.DataFrame({"run_id": runs, "time": t,
                         "window_ettr": np.clip((p_t - p_lo) / (t - lo), 0.0, 1.0),
                         "cumulative_ettr": np.clip(p_t / (t - starts), 0.0, 1.0)})


def max_unproductive_in_window(sliding: pd.DataFrame, spans: pd.DataFrame,
                               window_s: float = DEFAULT_WINDOW_S) -> float:
    """Most unproductive seconds in one full window on the grid (NaN if no full window)."""
    start = spans["start"].reindex(sliding["run_id"].to_numpy()).to_numpy()
    full = sliding["time"].to_numpy() - start >= window_s - 1e-9
    if not full.any():
        return float("nan")
    return float(window_s * (1.0 - sliding["window_ettr"].to_numpy()[full].min()))
