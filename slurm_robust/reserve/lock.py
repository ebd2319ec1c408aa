"""One exclusive lock for every reserve state change (reconcile, handoff).

``fcntl.flock`` on a lock file, polled until a deadline so a stuck holder cannot block
EpilogSlurmctld forever. The kernel drops the lock when its holder dies, so a crashed
reconcile never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_robust.errors import SlurmRobustError

POLL_S = 0.1


class ReserveLockTimeout(SlurmRobustError):
    """Another reserve operation held the lock past the timeout."""


@contextmanager
def reserve_lock(path: Path, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> Iterator[float]:
    """Hold the exclusive reserve lock; yields the seconds spent waiting for it.

    Raises:
        ReserveLockTimeout: not acquired within ``timeout_s`` (names the lock file).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # 0660: root (reconcile) and SlurmUser's group (EpilogSlurmctld) share the lock.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o660)
    start = clock()
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() - start >= timeout_s:
                    raise ReserveLockTimeout(
                        f"reserve lock {path} still held after {timeout_s:g} s; another "
                        "reconcile or handoff is running (or hung: see `fuser "
                        f"{path}`)") from None
                sleep(POLL_S)
        yield clock() - start
    finally:
        os.close(fd)
