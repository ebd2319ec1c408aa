"""Loaders: run event logs, verdicts and node health journals into typed DataFrames.

Formats are those of docs/SCHEMAS.md. Lines that are not JSON records are counted per
file (``records.read_records``); records that are JSON but lack a required field, or carry
one of the wrong type, are counted per file and event type; unknown event types (a newer
writer) are counted and ignored. Nothing is dropped silently and nothing is fatal.

Frames (one row per record):

- ``runs``: run_id, job_id, time (run_start), world_size, nodes, spares
- ``attempts``: run_id, job_id, attempt, time, restored_step, restore_tier, nodes
- ``steps``: run_id, job_id, attempt, time (step finished), step, step_time_s, loss,
  grad_norm, rank
- ``incidents``: run_id, job_id, attempt, time, incident, category, class, fault_time,
  detected_at, localized_at, recovered_at, rung, nodes, ranks, last_step, restored_step,
  restore_tier, steps_lost, evidence
- ``ends``: run_id, job_id, attempt, time, status, step
- ``findings``: the in-job monitor's (run_id, time, node, kind, check, severity, ...)
- ``controllers``: run_id, job_id, attempt, time, term, node, agent, takeover
- ``overloads``: run_id, job_id, attempt, time, lag_s, episodes, late_s, since, agents
- ``verdicts``: time, job_id, node, reason, class, incident
- ``health``: time, node, job, stage, run_id, check, status, duration_s, reason, injected
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from slurm_robust import records as rec
from slurm_robust.analysis.frames import LoadIssues, empty_frame, records_to_frame
from slurm_robust.analysis.taxonomy import (
    CATEGORIES,
    CLASSES,
    HEALTH_STATUSES,
    RUN_STATUSES,
    RUNGS,
    read_class,
)

EVENTS_FILE = "events.jsonl"
VERDICTS_FILE = "verdicts.jsonl"

_COMMON = {"run_id": ("category", True), "job_id": ("str", False),
           "attempt": ("int", True), "time": ("float", True)}

EVENT_SPECS: dict[str, dict[str, tuple[str, bool]]] = {
    "run_start": {**_COMMON, "world_size": ("int", False), "nodes": ("list", False),
                  "spares": ("list", False)},
    "attempt_start": {**_COMMON, "restored_step": ("int", False),
                      "restore_tier": ("category", False), "nodes": ("list", False)},
    "step": {**_COMMON, "step": ("int", True), "step_time_s": ("float", False),
             "loss": ("metric", False), "grad_norm": ("metric", False),
             "rank": ("int", False)},
    "incident": {**_COMMON, "incident": ("str", True), "category": ("category", True),
                 "class": ("category", True), "fault_time": ("float", False),
                 "detected_at": ("float", True), "localized_at": ("float", False),
                 "recovered_at": ("float", False), "rung": ("category", True),
                 "nodes": ("list", False), "ranks": ("list", False),
                 "last_step": ("int", False), "restored_step": ("int", False),
                 "restore_tier": ("category", False), "steps_lost": ("int", False),
                 "evidence": ("object", False)},
    "run_end": {**_COMMON, "status": ("category", True), "step": ("int", False)},
    # The in-job monitor's findings (docs/SCHEMAS.md, finding_version 1).
    "finding": {**_COMMON, "node": ("str", True), "agent": ("int", False),
                "kind": ("str", True), "check": ("str", True), "severity": ("str", True),
                "class": ("str", False), "reason": ("str", False),
                "seen_at": ("float", False), "evidence": ("object", False)},
    # A controller starting to act under a term (the first, or a successor's takeover).
    "controller": {**_COMMON, "term": ("int", True), "node": ("str", True),
                   "agent": ("int", False), "takeover": ("object", False)},
    # The controller's tick loop was late (overload_version 1); nobody was blamed for it.
    "controller_overload": {**_COMMON, "overload_version": ("int", False),
                            "lag_s": ("float", True), "episodes": ("int", False),
                            "late_s": ("float", False), "since": ("float", False),
                            "agents": ("int", False)},
}
FRAME_OF_EVENT = {"run_start": "runs", "attempt_start": "attempts", "step": "steps",
                  "incident": "incidents", "run_end": "ends", "finding": "findings",
                  "controller": "controllers", "controller_overload": "overloads"}
EVENT_CATEGORIES = {"category": CATEGORIES, "class": CLASSES, "rung": RUNGS,
                    "status": RUN_STATUSES}

VERDICT_SPEC = {"time": ("float", True), "job_id": ("str", True), "node": ("category", True),
                "reason": ("str", False), "class": ("category", False),
                "incident": ("str", False)}
HEALTH_SPEC = {"time": ("float", True), "node": ("category", True), "job": ("str", False),
               "stage": ("category", False), "run_id": ("str", False),
               "check": ("category", True), "status": ("category", True),
               "duration_s": ("float", False), "reason": ("str", False),
               "injected": ("bool", False)}


@dataclass
class RunLog:
    """Every run's events as frames, plus what could not be read."""

    runs: pd.DataFrame
    attempts: pd.DataFrame
    steps: pd.DataFrame
    incidents: pd.DataFrame
    ends: pd.DataFrame
    findings: pd.DataFrame = field(default_factory=lambda: empty_frame(
        EVENT_SPECS["finding"], EVENT_CATEGORIES))
    controllers: pd.DataFrame = field(default_factory=lambda: empty_frame(
        EVENT_SPECS["controller"], EVENT_CATEGORIES))
    overloads: pd.DataFrame = field(default_factory=lambda: empty_frame(
        EVENT_SPECS["controller_overload"], EVENT_CATEGORIES))
    issues: LoadIssues = field(default_factory=LoadIssues)


def events_from_records(records: Sequence[Mapping[str, Any]], source: str = "<records>",
                        issues: LoadIssues | None = None) -> RunLog:
    """Split ``slurm_robust.event`` records by event type into typed frames."""
    issues = issues if issues is not None else LoadIssues()
    by_event: dict[str, list[Mapping[str, Any]]] = {name: [] for name in EVENT_SPECS}
    for r in records:
        if r.get("schema") != rec.EVENT_SCHEMA:
            continue
        event = r.get("event")
        if event == "incident":
            read = _with_class(r, f"{source}: incident", issues, True)
            if read is None:
                continue
            r = read
        if event in by_event:
            by_event[event].append(r)
        else:
            issues.add(issues.unknown_events, f"{source}: {event}", 1)
    frames: dict[str, pd.DataFrame] = {}
    for event, spec in EVENT_SPECS.items():
        frame, invalid = records_to_frame(by_event[event], spec, EVENT_CATEGORIES)
        if invalid.any():
            first = int(invalid.argmax())
            issues.add(issues.invalid_records, f"{source}: {event}", int(invalid.sum()),
                       f"{source}: invalid {event} record {dict(by_event[event][first])!r:.200}")
        frames[FRAME_OF_EVENT[event]] = frame
    return RunLog(issues=issues, **unify_run_ids(frames))


def _with_class(record: Mapping[str, Any], key: str, issues: LoadIssues,
                with_category: bool) -> dict[str, Any] | None:
    """The record with its class read through the taxonomy (legacy names mapped), or
    None, counted as an invalid record with the reason, when the class is unknown or
    contradicts the record's category."""
    if "class" not in record:
        return dict(record)
    cls, why = read_class(record["class"], record.get("category") if with_category else None)
    if cls is None:
        issues.add(issues.invalid_records, f"{key} class", 1, f"{key}: {why}")
        return None
    return {**record, "class": cls}


def unify_run_ids(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Give ``run_id`` the same categories in every frame, so its codes are run keys."""
    cats = list(dict.fromkeys(c for frame in frames.values()
                              for c in frame["run_id"].cat.categories))
    return {name: frame.assign(run_id=frame["run_id"].cat.set_categories(cats))
            for name, frame in frames.items()}


def _read(path: Path, schema: str, issues: LoadIssues) -> list[dict[str, Any]]:
    result = rec.read_records(path, schema)
    if result.malformed:
        issues.add(issues.malformed_lines, str(path), result.malformed,
                   f"malformed line at {result.malformed_examples[0]}")
    return result.records


def load_run_dirs(run_dirs: Iterable[str | os.PathLike[str]],
                  issues: LoadIssues | None = None) -> RunLog:
    """Load ``events.jsonl`` of each run directory (a missing file is an invalid source)."""
    issues = issues if issues is not None else LoadIssues()
    parts: list[RunLog] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / EVENTS_FILE
        if not path.is_file():
            issues.add(issues.invalid_records, f"{path}: missing", 1, f"{path} does not exist")
            continue
        parts.append(events_from_records(_read(path, rec.EVENT_SCHEMA, issues), str(path),
                                         issues))
    return concat_runlogs(parts, issues)


def concat_runlogs(parts: Sequence[RunLog], issues: LoadIssues | None = None) -> RunLog:
    """Concatenate run logs, unifying categorical columns."""
    if not parts:
        return events_from_records([], issues=issues)
    names = tuple(FRAME_OF_EVENT.values())
    merged = {n: _concat([getattr(p, n) for p in parts]) for n in names}
    all_issues = issues if issues is not None else LoadIssues()
    if issues is None:
        for p in parts:
            all_issues.merge(p.issues)
    return RunLog(issues=all_issues, **unify_run_ids(merged))


def _concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)
    for col in frames[0].columns:
        if isinstance(frames[0][col].dtype, pd.CategoricalDtype):
            cats = list(dict.fromkeys(c for f in frames for c in f[col].cat.categories))
            out[col] = pd.Categorical(out[col].astype(object), categories=cats)
    return out


def load_verdicts(run_dirs: Iterable[str | os.PathLike[str]],
                  issues: LoadIssues | None = None) -> pd.DataFrame:
    """Load ``verdicts.jsonl`` of each run directory (missing file: no verdicts)."""
    issues = issues if issues is not None else LoadIssues()
    records: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        path = Path(run_dir) / VERDICTS_FILE
        got = _read(path, rec.VERDICT_SCHEMA, issues)
        records += [r for r in (_with_class(g, "verdicts", issues, False) for g in got) if r]
    frame, invalid = records_to_frame(records, VERDICT_SPEC, {"class": CLASSES})
    issues.add(issues.invalid_records, "verdicts", int(invalid.sum()),
               "invalid verdict record" if invalid.any() else "")
    return frame


def journal_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand directories into the ``*.jsonl`` files under them (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out += sorted(p.rglob("*.jsonl")) if p.is_dir() else [p]
    return out


def load_health(paths: Iterable[str | os.PathLike[str]],
                issues: LoadIssues | None = None) -> pd.DataFrame:
    """Load node health journals (files, or directories searched for ``*.jsonl``)."""
    issues = issues if issues is not None else LoadIssues()
    records: list[dict[str, Any]] = []
    for path in journal_paths(paths):
        records += _read(path, rec.HEALTH_SCHEMA, issues)
    frame, invalid = records_to_frame(records, HEALTH_SPEC, {"status": HEALTH_STATUSES})
    issues.add(issues.invalid_records, "health", int(invalid.sum()),
               "invalid health record" if invalid.any() else "")
    return frame
