"""Effective training time ratio (ETTR), cumulative and over a sliding window.

Definitions (ByteRobust §8 after Kokolis et al., Meta's "Revisiting Reliability"):

- **Wall time** of a run: from its first ``run_start`` record to its last ``run_end``
  record (a run without them: its first and last event), clipped to ``[since, until]``.
  Time spent pending between a requeue and the next attempt is wall time.
- **Step execution interval**: a step record finished at ``time`` and took
  ``step_time_s``, so it covers ``[time - step_time_s, time]``. (The launcher may sample
  step events when steps are very short; a record then stands for every step since the
  previous record of its attempt, ``covers`` steps, and its interval is
  ``[time - covers * step_time_s, time]`` cut at the previous record's time. Steps
  finished after an attempt's last record are invisible to any log reader, so redone
  counts from the log are then a lower bound; the incidents' own ``steps_lost`` is
  reported beside them.)
- **Kept step**: a step is *unproductive* when a later rollback undid it: some rollback
  at ``cutoff > time`` restored a state older than the step (``restored_step < step``).
  Rollbacks are every ``attempt_start`` after the run's first attempt (cutoff: its time;
  ``restored_step`` null means it started from scratch) and every incident with a
  ``restored_step`` (cutoff: ``detected_at``). All other steps are kept. So steps
  finished after the restored step but before the fault are redone and are not
  productive; the redone copies, finished after the rollback, are. (For a record that
  covers several steps, its earliest ``restored_step - prev_step`` steps are kept.)
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
A record without ``step_time_s`` (the launcher writes none for the first step of an
attempt, whose wall time holds the restart) is given its run's median step time: the
work of that step counts, the restart around it does not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from slurm_robust.analysis.loaders import RunLog

DEFAULT_WINDOW_S = 3600.0
_KEY = ["run_id", "attempt", "step"]


def run_codes(frame: pd.DataFrame) -> np.ndarray:
    """Integer run keys (the codes of the shared ``run_id`` categories, see loaders)."""
    return frame["run_id"].cat.codes.to_numpy(dtype=np.int64)


def _sorted_keys(run: np.ndarray, att: np.ndarray, step: np.ndarray,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Stable order by (run, attempt, step), and whether each row repeats the one before."""
    if len(run) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    s_min, a_min = int(step.min()), int(att.min())
    s_span, a_span = int(step.max()) - s_min + 1, int(att.max()) - a_min + 1
    if (int(run.max()) + 1) * a_span * s_span < 2**62:
        # One int64 key sorts far faster than a three-key lexsort.
        key = (run * a_span + (att - a_min)) * s_span + (step - s_min)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        same = np.zeros(len(ks), dtype=bool)
        same[1:] = ks[1:] == ks[:-1]
        return order, same
    order = np.lexsort((step, att, run))
    r, a, st = run[order], att[order], step[order]
    same = np.zeros(len(order), dtype=bool)
    same[1:] = (r[1:] == r[:-1]) & (a[1:] == a[:-1]) & (st[1:] == st[:-1])
    return order, same


def dedup_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """One record per (run, attempt, step), sorted by them (see the module docstring)."""
    cols = ["run_id", "attempt", "step", "time", "step_time_s", "loss"]
    rank_na = steps["rank"].isna().to_numpy()
    if rank_na.all():
        whole = steps[cols]
    else:
        whole = steps.loc[rank_na, cols]
        per_rank = steps.loc[~rank_na].groupby(_KEY, observed=True, sort=False).agg(
            time=("time", "max"), step_time_s=("step_time_s", "max"),
            loss=("loss", "mean")).reset_index()
        keys = pd.MultiIndex.from_arrays([run_codes(whole), whole["attempt"], whole["step"]])
        other = pd.MultiIndex.from_arrays([run_codes(per_rank), per_rank["attempt"],
                                           per_rank["step"]])
        whole = pd.concat([whole, per_rank.loc[~other.isin(keys), cols]], ignore_index=True)
    order, same = _sorted_keys(run_codes(whole), whole["attempt"].to_numpy(dtype=np.int64),
                               whole["step"].to_numpy(dtype=np.int64))
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ~same[1:]  # of equal keys keep the last record written
    return _fill_step_time(whole.take(order[last]).reset_index(drop=True))


def _fill_step_time(steps: pd.DataFrame) -> pd.DataFrame:
    missing = steps["step_time_s"].isna()
    if not missing.any():
        return steps
    median = steps["step_time_s"].groupby(run_codes(steps)).median()
    fill = median.reindex(run_codes(steps)[missing.to_numpy()]).fillna(0.0).to_numpy()
    steps.loc[missing, "step_time_s"] = fill
    return steps


def rollbacks(log: RunLog) -> pd.DataFrame:
    """Rollback points: run (code), cutoff, restored (-1 = restarted from scratch)."""
    att = log.attempts
    first = att.groupby("run_id", observed=True)["attempt"].transform("min")
    later = att[att["attempt"] > first]
    inc = log.incidents[log.incidents["restored_step"].notna()]
    return pd.DataFrame({
        "run": np.concatenate([run_codes(later), run_codes(inc)]),
        "cutoff": np.concatenate([later["time"].to_numpy(dtype=np.float64),
                                  inc["detected_at"].to_numpy(dtype=np.float64)]),
        "restored": np.concatenate([later["restored_step"].fillna(-1).to_numpy(dtype=np.int64),
                                    inc["restored_step"].to_numpy(dtype=np.int64)]),
        # The attempt the rollback starts (an incident is logged in it): a step record of
        # an earlier attempt stamped at the very cutoff time still comes before it.
        "attempt": np.concatenate([later["attempt"].to_numpy(dtype=np.int64),
                                   inc["attempt"].to_numpy(dtype=np.int64)])})


def cover_steps(steps: pd.DataFrame, attempts: pd.DataFrame) -> pd.DataFrame:
    """Add what each step record covers: prev_step, prev_time, covers.

    ``steps`` must be sorted by (run, attempt, step), as :func:`dedup_steps` returns it.

    A record covers the steps since the previous record of the same attempt
    (``covers = step - prev_step``, at least 1); the first record of an attempt covers
    the steps since the attempt's ``restored_step`` (since step 0 when that is null), and
    only itself when the attempt has no ``attempt_start`` record.
    ``prev_time`` is the previous record's time in the attempt (NaN for the first).
    """
    out = steps
    run = run_codes(steps)
    att = steps["attempt"].to_numpy(dtype=np.int64)
    t = steps["time"].to_numpy(dtype=np.float64)
    step = out["step"].to_numpy(dtype=np.int64)
    first = np.ones(len(out), dtype=bool)
    first[1:] = (run[1:] != run[:-1]) | (att[1:] != att[:-1])
    prev_step = np.empty(len(out), dtype=np.float64)
    prev_step[1:] = step[:-1]
    prev_time = np.full(len(out), np.nan)
    prev_time[1:] = t[:-1]
    prev_time[first] = np.nan
    restored = _attempt_restored(attempts, run[first], att[first])
    prev_step[first] = np.where(np.isnan(restored), step[first] - 1, restored)
    covers = np.maximum(step - prev_step, 1.0)
    return out.assign(prev_step=step - covers, prev_time=prev_time, covers=covers)


def _attempt_restored(attempts: pd.DataFrame, runs: np.ndarray, atts: np.ndarray) -> np.ndarray:
    key = run_codes(attempts) * (1 << 32) + attempts["attempt"].to_numpy(dtype=np.int64)
    # A null restored_step means "from scratch": everything since step 0.
    table = pd.Series(attempts["restored_step"].to_numpy(dtype=np.float64, na_value=0.0),
                      index=key)
    table = table[~table.index.duplicated(keep="last")]
    return table.reindex(runs * (1 << 32) + atts).to_numpy(dtype=np.float64)


def kept_steps(steps: pd.DataFrame, points: pd.DataFrame) -> np.ndarray:
    """How many of the steps each record covers were kept (0..covers), see the docstring.

    ``steps`` comes from :func:`cover_steps`; ``points`` from :func:`rollbacks`.
    """
    covers = steps["covers"].to_numpy(dtype=np.float64)
    if points.empty or steps.empty:
        return covers.copy()
    pts = points.sort_values(["run", "cutoff"], ascending=[True, False], kind="stable")
    # The smallest restored step among this and every later rollback of the run.
    pts = pts.assign(later_min=pts.groupby("run", sort=False)["restored"].cummin())
    pts = pts.sort_values("cutoff", kind="stable")
    runs = run_codes(steps)
    pos = np.flatnonzero(np.isin(runs, pts["run"].unique()))  # runs without one keep all
    left = pd.DataFrame({"run": runs[pos], "time": steps["time"].to_numpy()[pos],
                         "attempt": steps["attempt"].to_numpy(dtype=np.int64)[pos],
                         "pos": pos}).sort_values("time", kind="stable")
    right = pts[["run", "cutoff", "later_min"]]
    # A record at a cutoff's exact time belongs before the rollback when its attempt is
    # older than the one the rollback starts (zero-length detection and restart), after
    # it otherwise: exact matches first, then the strict search for the rest.
    hit = pd.merge_asof(left, pts[["run", "cutoff", "later_min", "attempt"]].rename(
        columns={"attempt": "cut_attempt"}), left_on="time", right_on="cutoff", by="run",
        direction="forward", allow_exact_matches=True)
    tie = (hit["cutoff"].to_numpy() == hit["time"].to_numpy()) & \
        (hit["attempt"].to_numpy() >= hit["cut_attempt"].fillna(-1).to_numpy())
    if tie.any():
        strict = pd.merge_asof(left[tie], right, left_on="time", right_on="cutoff", by="run",
                               direction="forward", allow_exact_matches=False)
        hit.loc[tie, "later_min"] = strict["later_min"].to_numpy()
    later_min = np.full(len(steps), np.nan)
    later_min[hit["pos"].to_numpy()] = hit["later_min"].to_numpy(dtype=np.float64)
    prev = steps["prev_step"].to_numpy(dtype=np.float64)
    return np.where(np.isnan(later_min), covers, np.clip(later_min - prev, 0.0, covers))


def run_spans(log: RunLog, since: float | None = None,
              until: float | None = None) -> pd.DataFrame:
    """Wall span per run, indexed by run code: run_id, start, end, wall_s.

    Every run named in any frame gets a row (categories of ``run_id``).
    """
    cats = log.steps["run_id"].cat.categories
    n = len(cats)
    first = np.full(n, np.inf)
    last = np.full(n, -np.inf)
    for frame in (log.runs, log.attempts, log.steps, log.incidents, log.ends):
        codes, t = run_codes(frame), frame["time"].to_numpy(dtype=np.float64)
        np.minimum.at(first, codes, t)
        np.maximum.at(last, codes, t)
    began = np.full(n, np.inf)
    np.minimum.at(began, run_codes(log.runs), log.runs["time"].to_numpy(dtype=np.float64))
    ended = np.full(n, -np.inf)
    np.maximum.at(ended, run_codes(log.ends), log.ends["time"].to_numpy(dtype=np.float64))
    start = np.where(np.isfinite(began), began, first)
    end = np.where(np.isfinite(ended), ended, last)
    if since is not None:
        start = np.maximum(start, since)
    if until is not None:
        end = np.minimum(end, until)
    end = np.maximum(end, start)
    spans = pd.DataFrame({"run_id": np.asarray(cats, dtype=object), "start": start,
                          "end": end, "wall_s": end - start})
    return spans[np.isfinite(spans["start"])]


def productive_intervals(steps: pd.DataFrame, spans: pd.DataFrame,
                         ) -> tuple[pd.DataFrame, np.ndarray]:
    """Disjoint productive intervals (run code, a, b, cum: length through this one) and
    the unproductive seconds of each step record (aligned to ``steps``).

    ``steps`` comes from :func:`cover_steps` with a ``kept_steps`` column. A record's
    execution interval is ``[time - covers * step_time_s, time]``, cut at the previous
    record's time; its kept fraction (the earliest steps) is productive.
    """
    run = run_codes(steps)
    t = steps["time"].to_numpy(dtype=np.float64)
    covers = steps["covers"].to_numpy(dtype=np.float64)
    a = t - covers * steps["step_time_s"].to_numpy(dtype=np.float64)
    a = np.fmax(a, steps["prev_time"].to_numpy(dtype=np.float64))
    frac = steps["kept_steps"].to_numpy(dtype=np.float64) / covers
    b = a + (t - a) * frac
    lost = (t - a) * (1.0 - frac)
    a = np.maximum(a, _by_code(spans, "start", run))
    b = np.minimum(b, _by_code(spans, "end", run))
    ok = b > a
    return _union(run[ok], a[ok], b[ok]), lost


def _by_code(spans: pd.DataFrame, column: str, codes: np.ndarray) -> np.ndarray:
    """``spans[column]`` for each run code (positional lookup; NaN for unknown runs)."""
    size = int(max(spans.index.max() if len(spans) else -1, codes.max() if len(codes) else -1))
    table = np.full(size + 1, np.nan)
    table[spans.index.to_numpy()] = spans[column].to_numpy()
    return table[codes]


def _union(run: np.ndarray, a: np.ndarray, b: np.ndarray) -> pd.DataFrame:
    """Disjoint union of intervals per run, sorted by (run, a), with cumulative length."""
    new_run = np.ones(len(run), dtype=bool)
    new_run[1:] = run[1:] != run[:-1]
    if len(run) and not (np.all(run[1:] >= run[:-1]) and np.all((a[1:] >= a[:-1])
                                                                 | new_run[1:])):
        order = np.lexsort((a, run))
        run, a, b = run[order], a[order], b[order]
        new_run[1:] = run[1:] != run[:-1]
    # Each interval adds only what lies beyond the latest end seen before it in its run.
    if np.all((b[1:] >= b[:-1]) | new_run[1:]):
        prev_end = np.concatenate([[-np.inf], b[:-1]])  # ends already ascending
    else:
        prev_end = pd.Series(b).groupby(run, sort=False).cummax().to_numpy()
        prev_end = np.concatenate([[-np.inf], prev_end[:-1]])
    prev_end[new_run] = -np.inf
    a = np.maximum(a, prev_end)
    ok = b > a
    run, a, b = run[ok], a[ok], b[ok]
    length = b - a
    total = np.cumsum(length)
    if len(run) == 0:
        return pd.DataFrame({"run": run, "a": a, "b": b, "cum": length})
    starts = np.flatnonzero(np.concatenate([[True], run[1:] != run[:-1]]))
    before = np.repeat(total[starts] - length[starts], np.diff(np.append(starts, len(run))))
    return pd.DataFrame({"run": run, "a": a, "b": b, "cum": total - before})


def productive_before(intervals: pd.DataFrame, runs: np.ndarray,
                      times: np.ndarray, by_start: pd.DataFrame | None = None) -> np.ndarray:
    """P(t): productive seconds of run ``runs[i]`` (code) before ``times[i]``.

    ``by_start``: the intervals already sorted by ``a`` (saves a sort per call).
    """
    out = np.zeros(len(times))
    if len(times) == 0 or intervals.empty:
        return out
    q = pd.DataFrame({"run": np.asarray(runs, dtype=np.int64),
                      "t": np.asarray(times, dtype=np.float64),
                      "pos": np.arange(len(times))}).sort_values("t", kind="stable")
    right = by_start if by_start is not None else intervals.sort_values("a", kind="stable")
    hit = pd.merge_asof(q, right, left_on="t", right_on="a", by="run",
                        direction="backward", allow_exact_matches=False)
    over = np.maximum(hit["b"].to_numpy() - hit["t"].to_numpy(), 0.0)
    out[hit["pos"].to_numpy()] = np.nan_to_num(hit["cum"].to_numpy() - over, nan=0.0)
    return out


def cumulative_ettr(intervals: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Per run: run_id, wall_s, productive_s, unproductive_s, ettr (NaN if zero wall)."""
    productive = np.bincount(intervals["run"].to_numpy(),
                             weights=(intervals["b"] - intervals["a"]).to_numpy(),
                             minlength=int(spans.index.max()) + 1 if len(spans) else 0)
    out = spans[["run_id", "wall_s"]].copy()
    out["productive_s"] = productive[spans.index.to_numpy()] if len(spans) else []
    out["unproductive_s"] = out["wall_s"] - out["productive_s"]
    wall = out["wall_s"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["ettr"] = np.where(wall > 0, out["productive_s"].to_numpy() / wall, np.nan)
    return out


def mark_step_reports(per_run: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Add ``step_reports`` (step records per run) and blank the ETTR of runs without
    any: a script that reports no steps has unknown productive time, not zero."""
    counts = np.bincount(run_codes(steps), minlength=int(per_run.index.max()) + 1
                         if len(per_run) else 0) if len(steps) else None
    out = per_run.copy()
    out["step_reports"] = (counts[out.index.to_numpy()] if counts is not None
                           else np.zeros(len(out), dtype=np.int64))
    out.loc[out["step_reports"] == 0, "ettr"] = np.nan
    return out


def overall_ettr(per_run: pd.DataFrame) -> float:
    """Sum of productive time over sum of wall time (NaN when there is no wall time),
    over the runs that report steps (when ``step_reports`` is known)."""
    if "step_reports" in per_run:
        per_run = per_run[per_run["step_reports"] > 0]
    wall = float(per_run["wall_s"].sum())
    return float(per_run["productive_s"].sum() / wall) if wall > 0 else float("nan")


def default_every(spans: pd.DataFrame, window_s: float,
                  max_points: int | None = None) -> float:
    """The sampling step: window/12, or finer when every run is shorter than the window
    (a few minutes of rehearsal would otherwise get a single sample and no curve).

    ``max_points`` bounds the grid: the step grows until the whole fleet fits in about
    that many samples (plus one end sample per run). A handful of rehearsal runs keeps
    its fine grid; a million short jobs would otherwise get ~36 samples each and
    several GiB of grid that no plot (at most 8 runs) or headline figure needs.
    """
    longest = float(spans["wall_s"].max()) if len(spans) else 0.0
    every = window_s / 12
    if 0.0 < longest < window_s:
        every = min(every, max(1.0, longest / 200))
    if max_points is not None and len(spans):
        every = max(every, float(spans["wall_s"].sum()) / max_points)
    return every


MAX_GRID_POINTS = 4_000_000
# Rows of the grid evaluated at once: the merges over a chunk hold ~150 bytes a row.
_GRID_CHUNK = 1_000_000


def sliding_ettr(intervals: pd.DataFrame, spans: pd.DataFrame,
                 window_s: float = DEFAULT_WINDOW_S, every_s: float | None = None,
                 ) -> pd.DataFrame:
    """Window and cumulative ETTR on a grid: run, time, window_ettr, cumulative_ettr.

    Without ``every_s`` the step is :func:`default_every` with :data:`MAX_GRID_POINTS`;
    an explicit ``every_s`` is honoured as given. The grid is evaluated in chunks of
    whole runs so the merges never hold more than about :data:`_GRID_CHUNK` rows.
    """
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    live = spans[spans["wall_s"] > 0]
    every = float(every_s if every_s is not None
                  else default_every(live, window_s, MAX_GRID_POINTS))
    counts = np.ceil(live["wall_s"].to_numpy() / every).astype(np.int64)
    codes = live.index.to_numpy(dtype=np.int64)
    # Intervals are sorted by (run, a) (see _union), so a run range is a slice.
    iv_runs = intervals["run"].to_numpy()
    if counts.sum() == 0:
        return _grid_chunk(intervals.iloc[:0], live, counts, every, window_s)
    bounds = np.searchsorted(np.cumsum(counts), np.arange(0, counts.sum(), _GRID_CHUNK),
                             side="right")
    parts = []
    for lo_i, hi_i in zip(bounds, np.append(bounds[1:], len(counts)), strict=True):
        lo_iv = np.searchsorted(iv_runs, codes[lo_i], side="left")
        hi_iv = np.searchsorted(iv_runs, codes[hi_i - 1], side="right")
        parts.append(_grid_chunk(intervals.iloc[lo_iv:hi_iv], live.iloc[lo_i:hi_i],
                                 counts[lo_i:hi_i], every, window_s))
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def _grid_chunk(intervals: pd.DataFrame, live: pd.DataFrame, counts: np.ndarray,
                every: float, window_s: float) -> pd.DataFrame:
    starts = np.repeat(live["start"].to_numpy(), counts)
    ends = np.repeat(live["end"].to_numpy(), counts)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    k = np.arange(counts.sum()) - offsets + 1
    t = np.minimum(starts + k * every, ends)
    runs = np.repeat(live.index.to_numpy(dtype=np.int64), counts)
    lo = np.maximum(t - window_s, starts)
    by_start = intervals.sort_values("a", kind="stable")
    p_t = productive_before(intervals, runs, t, by_start)
    p_lo = productive_before(intervals, runs, lo, by_start)
    return pd.DataFrame({"run": runs, "time": t, "start": starts,
                         "window_ettr": np.clip((p_t - p_lo) / (t - lo), 0.0, 1.0),
                         "cumulative_ettr": np.clip(p_t / (t - starts), 0.0, 1.0)})


def min_window_ettr(sliding: pd.DataFrame, window_s: float = DEFAULT_WINDOW_S) -> float:
    """Lowest ETTR of one full window on the grid (NaN if no full window).

    A window that reaches back before its run started is not an hour of that run: the
    first grid points hold only the start-up, so counting them would make every run's
    minimum 0."""
    full = (sliding["time"] - sliding["start"]).to_numpy() >= window_s - 1e-9
    if not full.any():
        return float("nan")
    return float(sliding["window_ettr"].to_numpy()[full].min())


def max_unproductive_in_window(sliding: pd.DataFrame,
                               window_s: float = DEFAULT_WINDOW_S) -> float:
    """Most unproductive seconds in one full window on the grid (NaN if no full window)."""
    full = (sliding["time"] - sliding["start"]).to_numpy() >= window_s - 1e-9
    if not full.any():
        return float("nan")
    return float(window_s * (1.0 - sliding["window_ettr"].to_numpy()[full].min()))
