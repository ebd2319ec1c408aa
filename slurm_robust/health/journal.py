"""The node health journal: ``<state_dir>/health/<node>.jsonl``, schema slurm_robust.health.

One record per check per suite run, appended with ONE ``write()`` per run, so
concurrent prologs on a node never interleave runs. The journal is world-readable, so
it is never locked itself (any reader could hold that lock and stall the prolog until
Slurm's prolog timeout): writers serialise on a separate 0600 lock
file of root's, with a bounded wait, and append even when the wait runs out (a single
O_APPEND write is atomic on a local file system). The file is opened with O_NOFOLLOW
and must be a regular file of ours that others cannot write.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slurm_robust.records import (
    HEALTH_SCHEMA,
    HEALTH_VERSION,
    encode_record,
    make_record,
    read_records,
)
from slurm_robust.site_config import SiteConfig, load_site_config

log = logging.getLogger("slurm_robust.health")


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
        **({"on_error": "closed"} if getattr(r, "on_error", "open") == "closed" else {}),
    }, now=now) for r in results]


#: Longest wait for the journal's lock file before appending anyway.
LOCK_WAIT_S = 2.0


def write_run(path: Path, records: list[dict[str, Any]]) -> None:
    data = b"".join(encode_record(r) for r in records)
    if not data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(path.with_name(f".{path.name}.lock"),
                      os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _check_ours(lock_fd, path)
        _lock_bounded(lock_fd, path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        try:
            _check_ours(fd, path)
            os.write(fd, data)
        finally:
            os.close(fd)
    finally:
        os.close(lock_fd)  # drops the lock


def _check_ours(fd: int, path: Path) -> None:
    st = os.fstat(fd)
    if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
            or st.st_mode & 0o022 or st.st_nlink != 1):
        raise OSError(f"{path} (or its lock file) is not a regular file of uid "
                      f"{os.geteuid()} that only it can write; refusing to append")


def _lock_bounded(fd: int, path: Path) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning("lock of %s held for over %.1f s; appending without it",
                            path, LOCK_WAIT_S)
                return
            time.sleep(0.01)


def read_journal(node: str, config: SiteConfig | None = None) -> list[dict[str, Any]]:
    """Every well-formed health record of the node, oldest first."""
    return read_records(journal_path(node, config), HEALTH_SCHEMA).records


def last_deep_pass(node: str, config: SiteConfig | None = None) -> float | None:
    """Unix time of the newest deep-suite run on ``node`` in which no check failed
    (and every fail-closed check could run).

    What the reserve uses to decide whether a standby node was checked recently.
    """
    runs: dict[str, dict[str, Any]] = {}
    for rec in read_journal(node, config):
        if rec.get("suite") != "deep" or not isinstance(rec.get("run_id"), str):
            continue
        run = runs.setdefault(rec["run_id"], {"time": 0.0, "failed": False})
        run["time"] = max(run["time"], float(rec.get("time", 0.0)))
        # A fail-closed check that could not run is no pass either.
        run["failed"] = run["failed"] or rec.get("status") == "fail" or (
            rec.get("status") == "error" and rec.get("on_error") == "closed")
    passed = [r["time"] for r in runs.values() if not r["failed"]]
    return max(passed) if passed else None
