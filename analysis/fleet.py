"""Fleet view over sacct: failed and requeued jobs by cause, node-hours lost, failure
rate per node-day, and the reserve size that rate implies.

Definitions (job-level sacct records; with ``--duplicates`` a requeued job has one record
per run, the earlier ones ending REQUEUED/NODE_FAIL/PREEMPTED):

- ``node-hours`` of a record = NNodes x ElapsedRaw / 3600.
- **Lost** records are those ending in a failure state (:data:`LOST_STATES`); their
  node-hours are *node-hours lost*. This is an upper bound on lost work: progress that a
  checkpoint kept survives the failure. CANCELLED is a user's decision and not counted.
- **Cause** of a lost record: its state, and for FAILED the exit code or signal.
- **Requeued jobs**: jobs with more than one record (see ``collapse_requeues``).
- **Node failures**: node events of kind drain/down/fail that started in the period; when
  no node events are given, NODE_FAIL records (one failed node each).
- **Failure rate per node-day** = node failures / (node-hours of all records / 24).
- **Nodes in use**: the peak number of nodes allocated at once (a sweep over record
  start/end); the reserve must cover failures among the nodes busy at one time.
- **Reserve**: ByteRobust's rule, the ``quantile`` (P99) of a binomial over the nodes in
  use, each failing with probability ``1 - exp(-rate x window_days)`` in the replacement
  window; computed by ``slurm_robust.reserve.sizing.binomial_quantile`` (the reserve
  feature's own rule, not a second copy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from slurm_robust.analysis.nodes import DRAIN_KINDS
from slurm_robust.analysis.slurm_text import collapse_requeues
from slurm_robust.reserve.sizing import binomial_quantile

LOST_STATES = ("FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "PREEMPTED",
               "REQUEUED", "DEADLINE")
DEFAULT_WINDOW_DAYS = 1.0
DEFAULT_QUANTILE = 0.99


@dataclass
class FleetView:
    """Headline fleet figures and the by-cause table."""

    jobs: int
    records: int
    requeued_jobs: int
    lost_records: int
    node_hours: float
    node_hours_lost: float
    node_failures: int
    failure_source: str
    failure_rate_per_node_day: float
    nodes_in_use: int
    window_days: float
    failure_prob_window: float
    reserve_size: int | None
    reserve_note: str
    by_cause: pd.DataFrame

    def headline(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "by_cause"}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def cause_table(records: pd.DataFrame) -> pd.DataFrame:
    """Lost records grouped by cause: cause, records, jobs, node_hours (most first)."""
    lost = records[records["state"].isin(LOST_STATES)]
    failed = lost["state"] == "FAILED"
    sig = lost["signal"].fillna(0).astype("int64").where(failed, 0)
    code = lost["exit_code"].fillna(-1).astype("int64").where(failed & (sig == 0), 0)
    hours = lost["nnodes"].fillna(0).astype("float64") * lost["elapsed_s"].fillna(0) / 3600
    keyed = pd.DataFrame({"state": lost["state"].astype(str), "sig": sig, "code": code,
                          "job": lost["job_raw"], "hours": hours})
    grouped = keyed.groupby(["state", "sig", "code"], sort=False).agg(
        records=("hours", "size"), jobs=("job", "nunique"), node_hours=("hours", "sum"))
    grouped = grouped.reset_index()
    grouped["cause"] = [_cause(s, g, c) for s, g, c in
                        zip(grouped["state"], grouped["sig"], grouped["code"], strict=True)]
    cols = ["cause", "records", "jobs", "node_hours"]
    return grouped[cols].sort_values("records", ascending=False, kind="stable").reset_index(
        drop=True)


def _cause(state: str, sig: int, code: int) -> str:
    if state != "FAILED":
        return state
    return f"FAILED (signal {sig})" if sig else f"FAILED (exit {code})"


def peak_nodes(records: pd.DataFrame) -> int:
    """Most nodes allocated at once, from record start/end times."""
    ok = records["start"].notna() & records["nnodes"].notna()
    start = records.loc[ok, "start"].to_numpy()
    end = records.loc[ok, "end"].fillna(np.inf).to_numpy()
    n = records.loc[ok, "nnodes"].to_numpy(dtype=np.int64)
    if len(n) == 0:
        return 0
    times = np.concatenate([start, end])
    delta = np.concatenate([n, -n])
    # Ends sort before starts at the same instant: back-to-back jobs do not overlap.
    order = np.lexsort((delta, times))
    return int(np.cumsum(delta[order]).max())


def fleet_view(records: pd.DataFrame, node_events: pd.DataFrame | None = None,
               since: float | None = None, window_days: float = DEFAULT_WINDOW_DAYS,
               quantile: float = DEFAULT_QUANTILE) -> FleetView:
    """Compute the fleet view from job-level sacct records (see module docstring)."""
    jobs = collapse_requeues(records)
    hours = records["nnodes"].fillna(0).astype("float64") * records["elapsed_s"].fillna(0) / 3600
    lost = records["state"].isin(LOST_STATES)
    if node_events is not None and not node_events.empty:
        ev = node_events[node_events["node"].notna() & node_events["kind"].isin(DRAIN_KINDS)]
        if since is not None:
            ev = ev[ev["start"] >= since]
        failures, source = len(ev), "node events"
    else:
        failures, source = int((records["state"] == "NODE_FAIL").sum()), "NODE_FAIL records"
    node_days = float(hours.sum()) / 24
    rate = failures / node_days if node_days > 0 else float("nan")
    prob = 1 - math.exp(-rate * window_days) if node_days > 0 else float("nan")
    nodes = peak_nodes(records)
    reserve, note = _reserve(nodes, prob, quantile)
    return FleetView(
        jobs=len(jobs), records=len(records), requeued_jobs=int((jobs["restarts"] > 0).sum()),
        lost_records=int(lost.sum()), node_hours=float(hours.sum()),
        node_hours_lost=float(hours[lost].sum()), node_failures=failures,
        failure_source=source, failure_rate_per_node_day=rate, nodes_in_use=nodes,
        window_days=window_days, failure_prob_window=prob, reserve_size=reserve,
        reserve_note=note, by_cause=cause_table(records))


def _reserve(nodes: int, prob: float, quantile: float) -> tuple[int | None, str]:
    if math.isnan(prob) or nodes == 0:
        return None, "no node-hours in the period"

    return int(binomial_quantile(nodes, prob, quantile)), (
        f"P{quantile * 100:g} of Binomial({nodes}, {prob:.3g})")
