"""What the simulated job hands to the metrics and the event log (a leaf: no simulator imports)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IncidentResult:
    """One incident as the metrics and the event log see it."""

    index: int
    name: str
    cls: str
    fault: float
    detected: float
    localized: float
    recovered: float | None
    rung: str
    nodes: tuple[str, ...]
    lost_s: float
    queue_wait_s: float = 0.0
    reason: str = ""
