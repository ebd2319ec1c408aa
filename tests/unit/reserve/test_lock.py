"""The reserve lock: exclusive across processes, with a timeout naming the lock file."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from slurm_robust.reserve.lock import ReserveLockTimeout, reserve_lock


def _hold(path: str, seconds: float, ready: multiprocessing.synchronize.Event) -> None:
    with reserve_lock(Path(path), 5):
        ready.set()
        time.sleep(seconds)


def test_second_holder_waits_then_times_out(tmp_path: Path) -> None:
    path = tmp_path / "reserve.lock"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(path), 1.0, ready))
    proc.start()
    try:
        assert ready.wait(5)
        with pytest.raises(ReserveLockTimeout, match="reserve.lock"), reserve_lock(path, 0.2):
            pass
        with reserve_lock(path, 5) as waited:  # released when the holder is done
            assert waited > 0.2
    finally:
        proc.join(5)


def test_lock_is_reentrant_across_sequential_uses(tmp_path: Path) -> None:
    path = tmp_path / "reserve.lock"
    for _ in range(3):
        with reserve_lock(path, 1) as waited:
            assert waited < 0.5
