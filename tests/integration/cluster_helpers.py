"""Small helpers shared by the integration tests (polling, shared output directories)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T], timeout_s: float = 60.0,
               interval_s: float = 0.3) -> T:
    """Poll ``probe`` until it returns something true and return that; fail after timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def shared_out_dir(cluster: Any, name: str) -> Path:
    """A directory on the mini-cluster's shared storage that every user's job can write."""
    path = cluster.cfg.shared_dir / "tests" / name
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    return path


def spare_path_victim(state: Any, controller: str) -> str:
    """An active node whose loss the in-job spare takes: neither the controller's node
    (failover) nor the batch node (agent 0's: losing it ends the job in Slurm's eyes, the
    requeue rung). ``state``: the run's state.json as loaded by load_state."""
    return next(n for n in state.slots if n not in (controller, state.members.get("0")))
