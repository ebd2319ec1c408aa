"""The node health journal: ``<state_dir>/health/<node>.jsonl``, schema slurm_robust.health.

One record per check per suite run, appended with ONE ``append_records`` call per run
(one ``flock`` + one ``write``), so concurrent prologs on a node never interleave runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slurm_robust.records import (
    HEALTH_SCHEMA,
    HEALTH_VERSION,
    append_records,
    make_record,
    read_records,
)
from slurm_robust.site_config import SiteConfig, load_site_config


def journal_path(node: str, config: SiteConfig | None = None) -> Path:
    cfg = config if config is not None else load_site_config()
    return cfg.state_path(node) / "health" / f"{node}.jsonl"


def make_records(node: str, job: str | None, stage: str, suite: str, run_id: str,
                 results: Iterable[Any], now: float) -> list[dict[str, Any]]:
    """Journal records for one run's CheckResults (all stamped with the run's end time)."""
    return [make_record(HEALTH_SCHEMA, HEALTH_VERSION, {
        "node": node, "job": job, "stage": stage, "suite": suite, "run_id": run_id,
        "check": r.check, "status": r.status.value, "duration_s": r.duration_s,
        "reason": r.reason, "evidence": r.evidence, "injected": r.injected,
    }, now=now) for r in results]


def write_run(path: Path, records: list[dict[str, Any]]) -> None:
    append_records(path, records)


def read_journal(node: str, config: SiteConfig | None = None) -> list[dict[str, Any]]:
    """Every well-formed health record of the node, oldest first."""
    return read_records(journal_path(node, config), HEALTH_SCHEMA).records


def last_deep_pass(node: str, config: SiteConfig | None = None) -> float | None:
    """Unix time of the newest deep-suite run on ``node`` in which no check failed.

    What the reserve uses to decide whether a standby node was checked recently.
    """
    runs: dict[str, dict[str, Any]] = {}
    for rec in read_journal(node, config):
        if rec.get("suite") != "deep" or not isinstance(rec.get("run_id"), str):
            continue
        run = runs.setdefault(rec["run_id"], {"time": 0.0, "failed": False})
        run["time"] = max(run["time"], float(rec.get("time", 0.0)))
        run["failed"] = run["failed"] or rec.get("status") == "fail"
    passed = [r["time"] for r in runs.values() if not r["failed"]]
    return max(passed) if passed else None
