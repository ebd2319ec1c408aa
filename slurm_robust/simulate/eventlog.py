"""The simulated run's event log, in the run schema (docs/SCHEMAS.md, slurm_robust.event).

The same records the launcher's :class:`~slurm_robust.launcher.control.events.EventLog` writes
(run_start, attempt_start, step, incident, run_end, with
:data:`~slurm_robust.launcher.control.events.INCIDENT_FIELDS`), stamped with simulated time
(seconds from 0). Step records are sparse, as the launcher samples them: one per
simulated minute and the last step before every fault (so the log says exactly which
steps were done, and the report's ETTR is exact); each covers the steps since the
previous record. Records are buffered and appended in chunks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from slurm_robust.records import EVENT_SCHEMA, EVENT_VERSION, append_records, make_record

if TYPE_CHECKING:
    from slurm_robust.simulate.results import IncidentResult

EVENTS_FILE = "events.jsonl"
RECORD_EVERY_S = 60.0
_CHUNK = 20000


class EventSink:
    """Writes the event log of one simulated run; with no path, only counts records."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, run_id: str = "sim",
                 job_id: str = "sim") -> None:
        self.path = None if run_dir is None else Path(run_dir) / EVENTS_FILE
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
        self.run_id, self.job_id = run_id, job_id
        self.attempt = 0
        self.buffer: list[dict[str, Any]] = []
        self.written = 0
        self.node_entries = 0  # machine names written in node lists (cost grows with them)

    def _emit(self, event: str, fields: dict[str, Any], now: float) -> None:
        self.written += 1
        if self.path is None:
            return
        self.buffer.append(make_record(EVENT_SCHEMA, EVENT_VERSION,
                                       {"run_id": self.run_id, "job_id": self.job_id,
                                        "attempt": self.attempt, "event": event, **fields},
                                       now))
        if len(self.buffer) >= _CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.path is not None and self.buffer:
            append_records(self.path, self.buffer)
        self.buffer = []

    def run_start(self, nodes: list[str], spares: list[str], now: float) -> None:
        self.node_entries += len(nodes) + len(spares)
        self._emit("run_start", {"nodes": nodes, "spares": spares, "world_size": len(nodes),
                                 "layout": {"dp": len(nodes)},
                                 "config": {"simulated": True}}, now)

    def attempt_start(self, nodes: list[str], restored_step: int | None, now: float) -> None:
        self.node_entries += len(nodes)
        if restored_step is not None:
            self.attempt += 1
        self._emit("attempt_start", {"nodes": nodes, "restored_step": restored_step,
                                     "restore_tier": None if restored_step is None
                                     else "memory"}, now)

    def steps(self, start: float, first_done: int, n: int, step_s: float) -> None:
        """Records for ``n`` steps done from ``start``: one per minute, and the last."""
        if n <= 0:
            return
        done = start + step_s * np.arange(1, n + 1)
        minute = np.floor(done / RECORD_EVERY_S)
        keep = np.ones(n, dtype=bool)
        keep[:-1] = minute[1:] != minute[:-1]
        kept = np.flatnonzero(keep)
        if self.path is None:
            self.written += len(kept)
            return
        for i in kept:
            self._emit("step", {"step": first_done + int(i) + 1, "step_time_s": step_s,
                                "loss": None, "grad_norm": None, "rank": None},
                       float(done[i]))

    def incident(self, r: IncidentResult, category: str, last_step: int) -> None:
        record = {"incident": f"i{r.index}", "category": category, "class": r.cls,
                  "fault_time": r.fault, "detected_at": r.detected,
                  "localized_at": r.localized, "recovered_at": r.recovered, "rung": r.rung,
                  "nodes": list(r.nodes), "ranks": [], "last_step": last_step,
                  "restored_step": last_step, "restore_tier": "memory", "steps_lost": 0,
                  "evidence": {"simulated": True, "symptom": r.name, "decision": r.reason,
                               "lost_s": round(r.lost_s, 3),
                               "queue_wait_s": round(r.queue_wait_s, 3)}}
        self._emit("incident", record, r.recovered if r.recovered is not None else r.fault)

    def run_end(self, status: str, step: int, now: float) -> None:
        self._emit("run_end", {"status": status, "step": step, "params_sha256": None,
                               "verdict": None}, now)
        self.flush()
