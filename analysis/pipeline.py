"""The whole analysis in one call: inputs (frames) -> every metric table.

:class:`Inputs` holds the loaded frames; :func:`analyse` runs the metric functions of
:mod:`ettr`, :mod:`incidents`, :mod:`nodes` and :mod:`fleet` over them, restricted to
``[since, until]``, and returns an :class:`Analysis` whose :meth:`Analysis.headline` is
the JSON the CLI prints.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from slurm_robust.analysis import ettr
from slurm_robust.analysis import incidents as inc_mod
from slurm_robust.analysis.allocations import allocation_table, boundary_summary
from slurm_robust.analysis.fleet import FleetView, fleet_view
from slurm_robust.analysis.frames import LoadIssues
from slurm_robust.analysis.loaders import RunLog, load_health, load_run_dirs, load_verdicts
from slurm_robust.analysis.nan import nan_by_resolution
from slurm_robust.analysis.nodes import node_table, repeat_offenders
from slurm_robust.analysis.slurm_text import (
    parse_node_events,
    parse_sacct,
)
from slurm_robust.analysis.taxonomy import CATEGORIES, RUNGS


@dataclass
class Inputs:
    """Everything the analysis reads, already parsed."""

    log: RunLog
    verdicts: pd.DataFrame
    health: pd.DataFrame
    node_events: pd.DataFrame
    sacct: pd.DataFrame | None = None  # job-level sacct records, or None without --sacct
    issues: LoadIssues = field(default_factory=LoadIssues)


@dataclass
class Analysis:
    """Every table the report shows."""

    steps: pd.DataFrame  # deduplicated step records: covers, kept_steps, lost_steps, lost_s
    spans: pd.DataFrame
    per_run: pd.DataFrame
    sliding: pd.DataFrame
    incidents: pd.DataFrame
    by_category: pd.DataFrame
    by_class: pd.DataFrame
    by_rung: pd.DataFrame
    nodes: pd.DataFrame
    fleet: FleetView | None
    issues: LoadIssues
    window_s: float
    since: float | None = None
    until: float | None = None
    findings: pd.DataFrame | None = None  # the in-job monitor's, with before_incident
    allocations: pd.DataFrame | None = None  # each Slurm allocation (allocations.py)
    control_plane: pd.DataFrame | None = None  # controller takeovers and overloads

    def headline(self) -> dict[str, Any]:
        """The figures a person looks at first, JSON-ready (NaN becomes null)."""
        inc = self.incidents
        out: dict[str, Any] = {
            "runs": int(len(self.per_run)),
            "wall_h": float(self.per_run["wall_s"].sum() / 3600),
            "productive_h": float(self.per_run["productive_s"].sum() / 3600),
            "ettr": ettr.overall_ettr(self.per_run),
            "window_s": self.window_s,
            "min_window_ettr": ettr.min_window_ettr(self.sliding, self.window_s),
            "max_unproductive_s_in_window": ettr.max_unproductive_in_window(
                self.sliding, self.window_s),
            "steps_kept": int(self.steps["kept_steps"].sum()),
            "steps_redone": int(self.steps["lost_steps"].sum()),
            "incidents": int(len(inc)),
            "by_category": _counts(inc["category"], CATEGORIES),
            "by_class": _counts(inc["class"], ()),
            "by_rung": _counts(inc["rung"], RUNGS),
            "nan_by_resolution": _nonzero(nan_by_resolution(inc)),
            "mean_time_to_detect_s": _mean(inc["time_to_detect"]),
            "mean_time_to_localize_s": _mean(inc["time_to_localize"]),
            "mean_time_to_recover_s": _mean(inc["time_to_recover"]),
            "lost_time_h": float(inc["lost_time_s"].sum() / 3600),
            "repeat_offenders": repeat_offenders(self.nodes),
            **({"allocations": boundary_summary(self.allocations)}
               if self.allocations is not None else {}),
            "unread": self.issues.as_dict(),
        }
        if self.fleet is not None:
            out["fleet"] = self.fleet.headline()
        return _json_ready(out)


def _nonzero(table: pd.DataFrame) -> dict[str, int]:
    """resolution -> count, the resolutions that occurred."""
    return {str(r): int(c) for r, c in zip(table["resolution"], table["count"], strict=True)
            if c}


def load_inputs(run_dirs: Sequence[str | os.PathLike[str]],
                journals: Sequence[str | os.PathLike[str]] = (),
                sacct_text: str | None = None) -> Inputs:
    """Load run directories, health journals and (optionally) recorded sacct text.

    ``sacct_text`` is ``sacct --parsable2`` output with its header line; live Slurm
    records come from :func:`fetch.fetch_slurm_records` instead.
    """
    issues = LoadIssues()
    log = load_run_dirs(run_dirs, issues)
    inputs = Inputs(log=log, verdicts=load_verdicts(run_dirs, issues),
                    health=load_health(journals, issues),
                    node_events=parse_node_events("").frame, issues=issues)
    if sacct_text is not None:
        jobs, _ = parse_sacct(sacct_text)
        issues.add(issues.malformed_lines, "sacct", jobs.malformed, f"sacct: {jobs.example}")
        inputs.sacct = jobs.frame
    return inputs


def _counts(series: pd.Series, order: tuple[str, ...]) -> dict[str, int]:
    counts = series.astype(object).value_counts()
    keys = list(order) + sorted(k for k in counts.index if k not in order)
    return {str(k): int(counts.get(k, 0)) for k in keys}


def _mean(series: pd.Series) -> float:
    return float(series.mean()) if series.notna().any() else float("nan")


def _json_ready(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_ready(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _in_window(times: pd.Series, since: float | None, until: float | None) -> np.ndarray:
    ok = np.ones(len(times), dtype=bool)
    t = times.to_numpy(dtype=np.float64)
    if since is not None:
        ok &= t >= since
    if until is not None:
        ok &= t <= until
    return ok


def analyse(inputs: Inputs, since: float | None = None, until: float | None = None,
            window_s: float = ettr.DEFAULT_WINDOW_S, every_s: float | None = None,
            ) -> Analysis:
    """Compute every table; incidents, checks and events outside the window are left out."""
    log = inputs.log
    spans = ettr.run_spans(log, since, until)
    steps = ettr.cover_steps(ettr.dedup_steps(log.steps), log.attempts)
    kept = ettr.kept_steps(steps, ettr.rollbacks(log))
    steps["kept_steps"] = kept
    steps["lost_steps"] = steps["covers"] - kept
    steps["kept"] = steps["lost_steps"] == 0
    intervals, steps["lost_s"] = ettr.productive_intervals(steps, spans)
    per_run = ettr.mark_step_reports(ettr.cumulative_ettr(intervals, spans), log.steps)
    sliding = ettr.sliding_ettr(intervals, spans, window_s, every_s)
    incidents = log.incidents[_in_window(log.incidents["detected_at"], since, until)]
    incidents = inc_mod.incident_metrics(incidents, steps[~steps["kept"]], spans)
    health = inputs.health[_in_window(inputs.health["time"], since, until)]
    verdicts = inputs.verdicts[_in_window(inputs.verdicts["time"], since, until)]
    events = inputs.node_events
    if until is not None:
        events = events[events["start"] <= until]
    if since is not None:
        events = events[events["end"].isna() | (events["end"] >= since)]
    nodes = node_table(incidents, verdicts, health, events, since, until)
    fleet = None
    if inputs.sacct is not None:
        sacct = inputs.sacct
        if since is not None:
            sacct = sacct[sacct["end"].isna() | (sacct["end"] >= since)]
        if until is not None:
            sacct = sacct[sacct["start"].isna() | (sacct["start"] <= until)]
        fleet = fleet_view(sacct, events, since)
    return Analysis(steps=steps, spans=spans, per_run=per_run, sliding=sliding,
                    incidents=incidents, by_category=inc_mod.by_category(incidents),
                    by_class=inc_mod.by_class(incidents), by_rung=inc_mod.by_rung(incidents),
                    nodes=nodes, fleet=fleet, issues=inputs.issues, window_s=window_s,
                    since=since, until=until,
                    findings=findings_before_incidents(
                        log.findings[_in_window(log.findings["time"], since, until)],
                        incidents),
                    allocations=_allocations_in(allocation_table(log), since, until),
                    control_plane=control_plane_table(
                        log.controllers[_in_window(log.controllers["time"], since, until)],
                        log.overloads[_in_window(log.overloads["time"], since, until)]))


#: The control plane table's columns (docs/SCHEMAS.md's controller events).
CONTROL_PLANE_COLUMNS = ("run_id", "time", "event", "term", "node", "replaced_agent",
                         "lag_s", "episodes", "late_s", "agents")


def control_plane_table(controllers: pd.DataFrame, overloads: pd.DataFrame) -> pd.DataFrame:
    """Controller takeovers (``controller``: a successor's term, the node it acts from and
    the agent whose controller it replaced) and overloads (``controller_overload``: the
    tick loop late by ``lag_s`` at worst, which no node was blamed for), in time order."""
    rows = []
    for c in controllers.to_dict("records"):
        takeover = c.get("takeover") if isinstance(c.get("takeover"), dict) else {}
        rows.append({"run_id": c["run_id"], "time": c["time"], "event": "takeover",
                     "term": c["term"], "node": c["node"],
                     "replaced_agent": takeover.get("previous_agent", pd.NA),
                     "lag_s": np.nan, "episodes": pd.NA, "late_s": np.nan, "agents": pd.NA})
    for o in overloads.to_dict("records"):
        rows.append({"run_id": o["run_id"], "time": o["time"], "event": "overload",
                     "term": pd.NA, "node": "", "replaced_agent": pd.NA,
                     "lag_s": o["lag_s"],
                     "episodes": o.get("episodes"), "late_s": o.get("late_s"),
                     "agents": o.get("agents")})
    out = pd.DataFrame(rows, columns=list(CONTROL_PLANE_COLUMNS))
    return out.sort_values("time", kind="stable").reset_index(drop=True)


def _allocations_in(table: pd.DataFrame, since: float | None,
                    until: float | None) -> pd.DataFrame:
    """Allocations that started within the window."""
    return table[_in_window(table["started_at"].astype(np.float64), since, until)]


#: A finding names the incident on its node that followed within this long.
FINDING_LEAD_S = 600.0


def findings_before_incidents(findings: pd.DataFrame, incidents: pd.DataFrame
                              ) -> pd.DataFrame:
    """The monitor's findings, each with the first incident of the same run on the same
    node detected within :data:`FINDING_LEAD_S` after it was seen ("Xid 79 seen 6 s
    before the crash"): ``before_incident`` is ``"<incident> <class> +<s> s"`` or empty."""
    out = findings[["run_id", "time", "node", "kind", "check", "severity", "class",
                    "reason", "seen_at"]].copy()
    seen = out["seen_at"].fillna(out["time"])
    labels: list[str] = []
    for run_id, node, t in zip(out["run_id"], out["node"], seen, strict=True):
        label = ""
        same = incidents[(incidents["run_id"] == run_id)
                         & (incidents["detected_at"] >= t)
                         & (incidents["detected_at"] <= t + FINDING_LEAD_S)]
        for inc in same.sort_values("detected_at").to_dict("records"):
            if node in (inc["nodes"] or []):
                label = f"{inc['incident']} {inc['class']} +{inc['detected_at'] - t:.1f} s"
                break
        labels.append(label)
    out["before_incident"] = labels
    return out
