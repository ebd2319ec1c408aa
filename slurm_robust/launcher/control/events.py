"""The run event log writer: ``<run_dir>/events.jsonl``, schema ``slurm_robust.event`` v1.

One writer per run: the controller (workers report to their agent, agents to the
controller), so no record is written twice. The fields follow docs/SCHEMAS.md exactly;
:data:`INCIDENT_FIELDS` lists the incident record's fields in the documented order.

Step events are sampled beyond ``max_per_s`` (the first and every incident-related
step are always written) so that fast steps do not flood the shared filesystem.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from slurm_robust.launcher.enums import Category
from slurm_robust.launcher.messages import Incident, IncidentRecord
from slurm_robust.records import EVENT_SCHEMA, EVENT_VERSION, append_records, make_record

INCIDENT_FIELDS = ("incident", "category", "class", "fault_time", "detected_at",
                   "localized_at", "recovered_at", "rung", "nodes", "ranks", "last_step",
                   "restored_step", "restore_tier", "steps_lost", "evidence")


class StepFields(TypedDict):
    """A ``step`` event's own fields (docs/SCHEMAS.md); the controller writes no rank."""

    step: int
    step_time_s: float | None
    loss: float | None
    grad_norm: float | None
    rank: None


@dataclass(frozen=True)
class _HeldStep:
    """A step event sampled out, kept until the next is written or a fault flushes it."""

    fields: StepFields
    time: float
    attempt: int


class EventLog:
    """Appends events of one run; ``attempt`` is updated by the controller."""

    def __init__(self, path: str | os.PathLike[str], run_id: str, job_id: str | None,
                 attempt: int = 0, max_per_s: float = 50.0) -> None:
        self.path = path
        self.run_id = run_id
        self.job_id = job_id
        self.attempt = attempt
        self._min_gap = 1.0 / max_per_s if max_per_s > 0 else 0.0
        self._last_step_event = 0.0
        #: Called with the time just before ``run_end`` is written: what a component
        #: holds back (the controller's rate-limited overload record) reaches the log
        #: ahead of the run's last record.
        self.before_end: list[Callable[[float], object]] = []
        #: The newest step sampled out (written by flush_step before an incident).
        self._held: _HeldStep | None = None

    def emit(self, event: str, fields: Mapping[str, Any], now: float | None = None) -> dict:
        record = make_record(EVENT_SCHEMA, EVENT_VERSION,
                             {"run_id": self.run_id, "job_id": self.job_id,
                              "attempt": self.attempt, "event": event, **fields}, now)
        # 0600: the run's config (its env included) is in run_start.
        append_records(self.path, [record], mode=0o600)
        return record

    def run_start(self, nodes: list[str], spares: list[str], world_size: int,
                  layout: Mapping[str, int], config: Mapping[str, Any]) -> dict:
        return self.emit("run_start", {"nodes": nodes, "spares": spares,
                                       "world_size": world_size, "layout": dict(layout),
                                       "config": dict(config)})

    def attempt_start(self, nodes: list[str], restored_step: int | None,
                      restore_tier: str | None, now: float | None = None) -> dict:
        """``now``: when the attempt started (before its first step; the record itself is
        written once the ranks said what they restored)."""
        return self.emit("attempt_start", {"nodes": nodes, "restored_step": restored_step,
                                           "restore_tier": restore_tier}, now=now)

    def controller(self, term: int, node: str, agent: int,
                   takeover: Mapping[str, Any] | None) -> dict:
        """A controller starts acting under ``term``; ``takeover`` says whom it
        replaced and how the old one was fenced (null for the first controller)."""
        return self.emit("controller", {"term": term, "node": node, "agent": agent,
                                        "takeover": dict(takeover) if takeover else None})

    def controller_overload(self, fields: Mapping[str, Any], now: float) -> dict:
        """The controller's tick loop was late (control/overload.py): how late, how
        often, since when; nobody was blamed for it."""
        return self.emit("controller_overload", fields, now)

    def step(self, step: int, step_time_s: float | None, loss: float | None,
             grad_norm: float | None, force: bool = False, now: float | None = None) -> bool:
        """Write a step event unless sampled out; returns whether it was written."""
        t = time.time() if now is None else now
        fields: StepFields = {"step": step, "step_time_s": step_time_s, "loss": _finite(loss),
                              "grad_norm": _finite(grad_norm), "rank": None}
        if not force and t - self._last_step_event < self._min_gap:
            self._held = _HeldStep(fields, t, self.attempt)
            return False
        self._last_step_event = t
        self._held = None
        self.emit("step", fields, now=t)
        return True

    def flush_step(self) -> bool:
        """Write the newest step if it was sampled out (the last step before a fault must
        be in the log, or the report's steps lost come out short); returns whether."""
        held, self._held = self._held, None
        if held is None or held.attempt != self.attempt:
            return False
        self.emit("step", held.fields, now=held.time)
        return True

    def incident(self, incident: Incident | Mapping[str, Any]) -> dict:
        """Write an incident record (a mapping: a tool's or a test's hand-made one)."""
        if isinstance(incident, Incident):
            return self.emit("incident", incident.record())
        missing = [k for k in INCIDENT_FIELDS if k not in incident]
        if missing:
            raise ValueError(f"incident record lacks {missing}")
        return self.emit("incident", {k: incident[k] for k in INCIDENT_FIELDS})

    def run_end(self, status: str, step: int | None, params_sha256: str | None,
                verdict: str | None) -> dict:
        now = time.time()
        for hook in self.before_end:
            hook(now)
        return self.emit("run_end", {"status": status, "step": step,
                                     "params_sha256": params_sha256, "verdict": verdict})


def _finite(value: float | None) -> float | None:
    # The schema's loss and grad_norm are numbers; a non-finite value is not one (the
    # record format refuses NaN), so it becomes null. A non-finite step never gets here
    # in practice: the worker stops before reporting it, and the incident has the value.
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def new_incident(incident_id: str, cls: str, category: str, detected_at: float, *,
                 fault_time: float | None = None, nodes: list[str] | None = None,
                 ranks: list[int] | None = None, last_step: int | None = None,
                 evidence: Mapping[str, Any] | None = None) -> Incident:
    """A new, unresolved incident."""
    return Incident(incident=incident_id, category=Category(category), cls=str(cls),
                    fault_time=fault_time, detected_at=detected_at, nodes=list(nodes or []),
                    ranks=list(ranks or []), last_step=last_step,
                    evidence=dict(evidence or {}))


def make_incident(incident_id: str, cls: str, category: str, detected_at: float, *,
                  fault_time: float | None = None, nodes: list[str] | None = None,
                  ranks: list[int] | None = None, last_step: int | None = None,
                  evidence: Mapping[str, Any] | None = None) -> IncidentRecord:
    """:func:`new_incident` as its JSON record, every documented field present in the
    documented order (for tools and tests that write an event log by hand)."""
    return new_incident(incident_id, cls, category, detected_at, fault_time=fault_time,
                        nodes=nodes, ranks=ranks, last_step=last_step,
                        evidence=evidence).record()


def last_logged_step(path: str | os.PathLike[str], tail_bytes: int = 1 << 16) -> int | None:
    """The newest ``step`` event's step, read from the file's tail (None: no step yet).

    Used by an agent that lost the controller: the state file is persisted about once a
    second, the event log at every (sampled) step.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail_bytes))
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return None
    for raw in reversed(lines):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # the first line of the tail is usually cut
        if isinstance(rec, dict) and rec.get("event") == "step":
            return int(rec["step"])
    return None
