"""Waiting for a rehearsal's state to appear, shared by the cluster benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slurm_robust.errors import SlurmRobustError


def wait_for(probe: Callable[[], Any], timeout: float, what: str,
             every_s: float = 0.2) -> Any:
    """Poll ``probe`` until it returns something truthy (returned), or raise after
    ``timeout`` seconds naming ``what`` was waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every_s)
    raise SlurmRobustError(f"timed out after {timeout:g} s waiting for {what}")
