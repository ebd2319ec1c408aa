"""Recovery times measured in this project's rehearsal runs (``--recovery-times measured``).

Reads ``runs/*/events.jsonl`` (docs/SCHEMAS.md) under a directory and takes, from every
recovered incident, the failover time ``recovered_at - localized_at`` by rung: in_place
-> restart, spare -> spare activation, requeue -> requeue. A rung with no measurement
keeps its default (the paper's), and the result says which ones were measured.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slurm_robust.errors import UsageError
from slurm_robust.records import EVENT_SCHEMA, read_records
from slurm_robust.simulate.config import RecoveryTimes
from slurm_robust.simulate.dists import Dist
from slurm_robust.vocabulary import Rung

RUNG_FIELD = {Rung.IN_PLACE: "restart", Rung.SPARE: "spare", Rung.REQUEUE: "requeue"}


def failover_samples(root: str | Path) -> dict[str, list[float]]:
    """Failover seconds by rung from every ``*/events.jsonl`` under ``root``."""
    out: dict[str, list[float]] = {r: [] for r in RUNG_FIELD}
    for path in sorted(Path(root).glob("*/events.jsonl")):
        for rec in read_records(path, EVENT_SCHEMA).records:
            if rec.get("event") != "incident" or rec.get("rung") not in RUNG_FIELD:
                continue
            loc, done = rec.get("localized_at"), rec.get("recovered_at")
            if isinstance(loc, int | float) and isinstance(done, int | float) and done >= loc:
                out[rec["rung"]].append(float(done - loc))
    return out


def measured_times(root: str | Path, base: RecoveryTimes) -> RecoveryTimes:
    samples = failover_samples(root)
    if not any(samples.values()):
        raise UsageError(f"no recovered incidents in {root}/*/events.jsonl; run a rehearsal "
                         "first (`slurm-robust inject ...`) or give --recovery-times FILE")
    got = {RUNG_FIELD[r]: Dist("empirical", values=tuple(v)) for r, v in samples.items() if v}
    desc = ", ".join(f"{r}: {len(v)}" for r, v in samples.items() if v)
    return replace(base, source=f"measured in {root} ({desc}); others: {base.source}", **got)
