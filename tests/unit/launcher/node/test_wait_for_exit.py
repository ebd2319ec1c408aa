"""workers.wait_for_exit: the agent's wait between reports ends when a worker exits.

Real child processes; the bounds are loose on purpose (a wait that ignored the exit
would take the whole 30 s timeout, one that sees it takes a few tenths of a second)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_robust.launcher.node import workers as wk


def _worker(tmp_path: Path, code: str) -> wk.Worker:
    popen = subprocess.Popen([sys.executable, "-c", code])
    return wk.Worker(0, 0, 0, popen, tmp_path / "log", tmp_path / "progress", time.time())


def test_the_wait_ends_when_a_worker_exits(tmp_path):
    alive = _worker(tmp_path, "import time; time.sleep(60)")
    dying = _worker(tmp_path, "import time; time.sleep(0.3)")
    try:
        t0 = time.monotonic()
        wk.wait_for_exit([alive, dying], 30.0)
        assert time.monotonic() - t0 < 10.0
        assert dying.popen.poll() is not None and alive.popen.poll() is None
    finally:
        alive.popen.kill()
        alive.popen.wait()


def test_a_worker_dead_before_the_wait_returns_at_once(tmp_path):
    dead = _worker(tmp_path, "pass")
    while dead.popen.poll() is None:  # reaped, not yet reported
        time.sleep(0.01)
    t0 = time.monotonic()
    wk.wait_for_exit([dead], 30.0)
    assert time.monotonic() - t0 < 10.0
    unreaped = _worker(tmp_path, "pass")
    time.sleep(0.5)  # a zombie: its pidfd is readable at once
    t0 = time.monotonic()
    wk.wait_for_exit([unreaped], 30.0)
    assert time.monotonic() - t0 < 10.0
    unreaped.popen.wait()


def test_without_pidfds_it_is_the_plain_sleep(tmp_path, monkeypatch):
    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(wk.os, "pidfd_open", refused)
    w = _worker(tmp_path, "import time; time.sleep(60)")
    try:
        t0 = time.monotonic()
        wk.wait_for_exit([w], 0.3)
        assert time.monotonic() - t0 >= 0.3
    finally:
        w.popen.kill()
        w.popen.wait()


@pytest.mark.parametrize("timeout_s", [0.05, 0.2])
def test_no_workers_sleeps_the_timeout(timeout_s):
    t0 = time.monotonic()
    wk.wait_for_exit([], timeout_s)
    assert time.monotonic() - t0 >= timeout_s


# ------------------------------------------------- descriptors above 1024, and none left
def _high_fd(fd: int, at_least: int = 1500) -> int:
    """``fd`` duplicated to a number above select()'s FD_SETSIZE (1024)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= at_least:
        pytest.skip(f"hard RLIMIT_NOFILE {hard} leaves no descriptor above {at_least}")
    if soft != resource.RLIM_INFINITY and soft <= at_least:
        resource.setrlimit(resource.RLIMIT_NOFILE, (at_least + 1, hard))
    import os
    return os.dup2(fd, at_least)


def test_a_wake_descriptor_above_1024_wakes_the_wait(tmp_path):
    import os
    import socket
    alive = _worker(tmp_path, "import time; time.sleep(60)")
    a, b = socket.socketpair()
    high = _high_fd(a.fileno())
    try:
        b.sendall(b"\n")  # the controller's wake-up
        t0 = time.monotonic()
        wk.wait_for_exit([alive], 30.0, wake_fd=high)
        assert time.monotonic() - t0 < 10.0
    finally:
        os.close(high)
        a.close()
        b.close()
        alive.popen.kill()
        alive.popen.wait()


def test_the_wait_survives_running_out_of_descriptors(tmp_path, monkeypatch):
    import errno
    import socket

    def emfile(pid: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(wk.os, "pidfd_open", emfile)
    alive = _worker(tmp_path, "import time; time.sleep(60)")
    a, b = socket.socketpair()
    try:
        b.sendall(b"\n")
        t0 = time.monotonic()
        wk.wait_for_exit([alive], 30.0, wake_fd=a.fileno())  # the channel still wakes it
        assert time.monotonic() - t0 < 10.0
        t0 = time.monotonic()
        wk.wait_for_exit([alive], 0.2)  # nothing to watch: a plain sleep, no error
        assert 0.15 < time.monotonic() - t0 < 5.0
    finally:
        a.close()
        b.close()
        alive.popen.kill()
        alive.popen.wait()



def test_the_open_file_limit_is_raised_to_the_hard_limit():
    import subprocess
    code = ("import resource\n"
            "from slurm_robust.launcher.limits import raise_nofile_limit\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "if hard == resource.RLIM_INFINITY or hard < 64: raise SystemExit(3)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (min(32, hard), hard))\n"
            "got = raise_nofile_limit()\n"
            "assert got == (hard, hard) == resource.getrlimit(resource.RLIMIT_NOFILE), got\n")
    rc = subprocess.run([sys.executable, "-c", code], check=False).returncode
    if rc == 3:
        pytest.skip("no finite hard limit above 64 here")
    assert rc == 0
