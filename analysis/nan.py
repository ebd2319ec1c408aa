"""NaN incidents by how the NaN ladder resolved them, with the time of each
stage: detection, localisation (origin named; for an eviction, the bitwise test's
answer), recovery, the replay that told data from hardware, the bitwise test, and the
dual-phase replay that located a machine (``dual_replay_s``).

Reads the incident records' ``evidence.nan`` (docs/SCHEMAS.md); NaN incidents written
before the ladder existed have no resolution and count as ``unknown``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

#: The NaN ladder's resolutions, in ladder order (launcher/control/nan_ladder.py).
RESOLUTIONS = ("reattempt", "rollback", "skip", "stop", "replay", "evict")
STAGE_COLUMNS = ("time_to_detect", "time_to_localize", "time_to_recover", "replay_s",
                 "bitwise_s", "dual_replay_s")


def _nan_evidence(evidence: Any) -> dict[str, Any]:
    nan = evidence.get("nan") if isinstance(evidence, dict) else None
    return nan if isinstance(nan, dict) else {}


def nan_incidents(incidents: pd.DataFrame) -> pd.DataFrame:
    """The NaN incidents with ``resolution``, ``origin``, ``replay_s`` and ``bitwise_s``."""
    if "class" not in incidents.columns or not len(incidents):
        return pd.DataFrame(columns=["incident", "resolution", "origin", *STAGE_COLUMNS])
    nan = incidents[incidents["class"].astype(str) == "nan"].copy()
    ev = [_nan_evidence(e) for e in nan.get("evidence", pd.Series([None] * len(nan)))]
    nan["resolution"] = [str(e.get("resolution") or "unknown") for e in ev]
    nan["origin"] = [str(e.get("origin") or "unknown") for e in ev]
    nan["replay_s"] = pd.to_numeric(pd.Series([e.get("replay_s") for e in ev],
                                              index=nan.index, dtype=object), errors="coerce")
    nan["bitwise_s"] = pd.to_numeric(pd.Series(
        [(e.get("bitwise") or {}).get("seconds") if isinstance(e.get("bitwise"), dict)
         else None for e in ev], index=nan.index, dtype=object), errors="coerce")
    nan["dual_replay_s"] = pd.to_numeric(pd.Series(
        [(e.get("replay") or {}).get("seconds") if isinstance(e.get("replay"), dict)
         else None for e in ev], index=nan.index, dtype=object), errors="coerce")
    return nan


def nan_by_resolution(incidents: pd.DataFrame) -> pd.DataFrame:
    """One row per resolution (every ladder resolution, zero where none): count and the
    mean of each stage's time in seconds."""
    nan = nan_incidents(incidents)
    cols = [c for c in STAGE_COLUMNS if c in nan.columns]
    order = list(RESOLUTIONS) + sorted(set(nan["resolution"]) - set(RESOLUTIONS))
    rows = []
    for res in order:
        part = nan[nan["resolution"] == res]
        row: dict[str, Any] = {"resolution": res, "count": int(len(part))}
        for c in cols:
            values = pd.to_numeric(part[c], errors="coerce").dropna()
            row[f"mean_{c}"] = float(values.mean()) if len(values) else None
        rows.append(row)
    return pd.DataFrame(rows)
