"""Start and stop the mini-cluster's daemons, each tracked by a pid file we write.

Daemons run in the foreground (``-D``/``-F``) as children we detach, so we know each pid
at once and capture early errors in the daemon's own log. A pid counts as ours only if
the process's environment carries the cluster marker with this cluster's root, so a
recycled pid is never signalled.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_robust.errors import SlurmRobustError
from slurm_robust.records import write_bytes_atomic
from slurm_robust.stacks.procfs import read_stat
from slurm_robust_rehearsal.cluster.config import MARKER_ENV

log = logging.getLogger("slurm_robust_rehearsal.cluster")


class ClusterError(SlurmRobustError):
    """The mini-cluster could not be started, stopped or reached."""


@dataclass(frozen=True)
class Daemon:
    """One process of the mini-cluster."""

    name: str
    argv: tuple[str, ...]
    pidfile: Path
    logfile: Path

    def pid(self, root: Path) -> int | None:
        """The daemon's pid if it runs and is ours, else None."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if is_ours(pid, root) else None


def process_marker(pid: int) -> str | None:
    """The cluster marker in a process's environment, or None (gone, foreign, unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{MARKER_ENV}=".encode()
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def is_ours(pid: int, root: Path) -> bool:
    if pid <= 1:
        return False
    stat = read_stat(pid)  # bytes: a test's hostile user names a process in non-UTF-8
    if stat is None or not stat[1]:
        return False
    return stat[1][0] != "Z" and process_marker(pid) == str(root)


def our_processes(root: Path) -> list[int]:
    """Every live process carrying this cluster's marker (daemons and their slurmstepds)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and is_ours(int(entry), root):
            pids.append(int(entry))
    return pids


def start_daemon(daemon: Daemon, root: Path, env: Mapping[str, str]) -> int:
    """Start a daemon unless it already runs; returns its pid."""
    pid = daemon.pid(root)
    if pid is not None:
        return pid
    daemon.logfile.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env)
    full_env[MARKER_ENV] = str(root)
    with open(daemon.logfile, "ab") as out:
        proc = subprocess.Popen(list(daemon.argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True, close_fds=True)
    write_bytes_atomic(daemon.pidfile, [f"{proc.pid}\n".encode()], durable=False)
    time.sleep(0.2)
    if proc.poll() is not None:
        raise ClusterError(f"{daemon.name} exited at start with {proc.returncode}; "
                           f"see {daemon.logfile}: {tail(daemon.logfile)}")
    log.info("started %s (pid %d)", daemon.name, proc.pid)
    return proc.pid


def stop_pids(pids: Sequence[int], root: Path, timeout_s: float = 15.0) -> list[int]:
    """SIGTERM our processes, SIGKILL what is left after the timeout; returns survivors."""
    live = [p for p in pids if is_ours(p, root)]
    for pid in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while live and time.monotonic() < deadline:
        time.sleep(0.1)
        live = [p for p in live if is_ours(p, root)]
    for pid in live:
        _signal(pid, signal.SIGKILL)
    time.sleep(0.2 if live else 0)
    return [p for p in live if is_ours(p, root)]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_for(what: str, probe: Callable[[], bool], timeout_s: float,
             hint: str = "", interval_s: float = 0.25) -> float:
    """Poll ``probe`` until true; returns the seconds waited or raises ClusterError."""
    start = time.monotonic()
    while True:
        try:
            if probe():
                return time.monotonic() - start
        except OSError:
            pass
        if time.monotonic() - start > timeout_s:
            raise ClusterError(f"timed out after {timeout_s:g} s waiting for {what}"
                               + (f"; {hint}" if hint else ""))
        time.sleep(interval_s)


def tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"
