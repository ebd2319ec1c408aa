"""The environment a robust worker gets from the agent, for one process in a unit test
(memory tier only, no peer backup), and the progress lines it writes: shared by the
framework callbacks' tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def robust_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, job: str) -> Path:
    progress = tmp_path / f"progress-{job}.jsonl"
    monkeypatch.setenv("SLURM_ROBUST_PROGRESS", str(progress))
    monkeypatch.setenv("SLURM_ROBUST_CKPT", json.dumps({
        "shm_root": str(tmp_path / "shm"), "local_root": None, "durable_root": None,
        "local_every": 0, "durable_every": 0, "peer_backup": False}))
    monkeypatch.setenv("SLURM_ROBUST_JOB_ID", job)
    monkeypatch.setenv("SLURM_ROBUST_NODE", "n1")
    for var in ("RANK", "WORLD_SIZE", "SLURM_ROBUST_RUN_DIR"):
        monkeypatch.delenv(var, raising=False)
    return progress


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
