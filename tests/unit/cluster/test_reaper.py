"""The subreaper each mini-cluster slurmd runs under (cluster/reaper.py): orphans are
reaped at once, signals reach the command, and the command dies with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurm_robust_rehearsal.cluster.manager import REAPER

#: Like slurmd: a long-lived command whose double-forked grandchild is orphaned and
#: dies; it prints the grandchild's pid, then whether /proc still lists it a while later.
ORPHANING = textwrap.dedent("""
    import os, sys, time
    r, w = os.pipe()
    if os.fork() == 0:
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(0.2)
            os._exit(0)
        os._exit(0)
    os.wait()
    orphan = int(os.read(r, 32))
    time.sleep(1.0)
    try:
        state = open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    print(orphan, state, flush=True)
""")


def _reaper(*argv: str, **kw) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(REAPER), *argv], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _wait_for_child(pid: int, timeout_s: float = 30.0) -> None:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + timeout_s
    while not children.read_text().split():
        assert time.monotonic() < deadline, "the reaper never started its command"
        time.sleep(0.01)


def test_an_orphan_of_the_command_is_reaped_as_soon_as_it_dies():
    proc = _reaper(sys.executable, "-c", ORPHANING)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    _pid, state = out.split()
    assert state == "gone"  # not "Z": a zombie until whoever adopted it reaps


def test_signals_reach_the_command_and_its_status_is_the_reapers():
    proc = _reaper(sys.executable, "-c", textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        print("ready", flush=True)
        time.sleep(30)
    """))
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 7
    killed = _reaper("sleep", "30")
    _wait_for_child(killed.pid)  # the reaper has forked: from then on nothing is lost
    killed.send_signal(signal.SIGINT)  # sleep dies of it: 128 + SIGINT, as a shell says
    assert killed.wait(timeout=10) == 128 + signal.SIGINT


def test_the_command_dies_with_the_reaper(tmp_path: Path):
    pidfile = tmp_path / "pid"
    proc = _reaper("sh", "-c", f'echo $$ > {pidfile}; exec sleep 30')
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    command = int(pidfile.read_text())
    proc.kill()  # as `inject kill-node` kills the pid in the daemon's pid file
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(command):
        assert time.monotonic() < deadline, "the command outlived its reaper"
        time.sleep(0.05)


def test_a_command_that_cannot_run_says_so():
    proc = _reaper("/nonexistent/slurmd")
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 127 and "cannot run /nonexistent/slurmd" in err


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/usr/sbin/nologin").exists(), reason="no /usr/sbin/nologin")
def test_a_command_started_without_path_is_looked_up_where_a_shell_would():
    """The break-fix loop runs `cluster reboot` in a clean environment: slurmd, in
    /usr/sbin (like nologin, used here), must still start."""
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    proc = subprocess.run([sys.executable, str(REAPER), "nologin"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert "cannot run" not in proc.stderr, proc.stderr
    assert proc.returncode == 1 and "not available" in proc.stdout + proc.stderr
