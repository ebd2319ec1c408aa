"""Process facts from /proc: descendants, command lines, whether a signal is caught.

psutil is not a dependency; everything here reads /proc directly and treats a process
that vanishes mid-read as gone (it is normal for data-loader workers to come and go).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
CMDLINE_MAX = 300


def ppid_map(proc: Path = PROC) -> dict[int, int]:
    """``{pid: ppid}`` for every process visible in /proc (one scan)."""
    parents: dict[int, int] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        ppid = read_ppid(int(entry.name), proc)
        if ppid is not None:
            parents[int(entry.name)] = ppid
    return parents


def read_stat(pid: int, proc: Path = PROC) -> tuple[str, list[str]] | None:
    """``(comm, fields after comm)`` from /proc/<pid>/stat (``fields[0]`` the state,
    ``[1]`` the parent, ``[19]`` the start time); None when the process is gone.

    Read as bytes: comm is whatever the process named itself (``prctl(PR_SET_NAME)``
    takes any bytes), so another user's process can make it invalid UTF-8, and may put
    spaces and parentheses in it (the fields start after the last one)."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    head, sep, tail = raw.rpartition(b")")
    if not sep:
        return None
    comm = head.partition(b"(")[2].decode(errors="replace")
    return comm, tail.decode("ascii", errors="replace").split()


def read_ppid(pid: int, proc: Path = PROC) -> int | None:
    stat = read_stat(pid, proc)
    try:
        return int(stat[1][1]) if stat is not None else None
    except (IndexError, ValueError):
        return None


def descendants(roots: Iterable[int], parents: dict[int, int] | None = None,
                proc: Path = PROC) -> dict[int, list[tuple[int, int]]]:
    """For each root pid, its descendants as ``(pid, ppid)`` in breadth-first order."""
    parents = ppid_map(proc) if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, list[tuple[int, int]]] = {}
    for root in roots:
        found: list[tuple[int, int]] = []
        queue = [root]
        seen = {root}
        while queue:
            parent = queue.pop(0)
            for child in sorted(children.get(parent, [])):
                if child not in seen:
                    seen.add(child)
                    found.append((child, parent))
                    queue.append(child)
        out[root] = found
    return out


def cmdline(pid: int, proc: Path = PROC) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:CMDLINE_MAX]


def exists(pid: int, proc: Path = PROC) -> bool:
    return (proc / str(pid)).exists()


def catches_signal(pid: int, signum: int, proc: Path = PROC) -> bool:
    """True when the process has a handler for ``signum`` (SigCgt in its status).

    Sending SIGUSR2 to a process without a handler would kill it, so the faulthandler
    fallback checks this first.
    """
    try:
        # Bytes first: the Name line is the process's own choice (read_stat).
        status = (proc / str(pid) / "status").read_bytes().decode(errors="replace")
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return bool(mask & (1 << (signum - 1)))
    return False


def environ_value(pid: int, name: str, proc: Path = PROC) -> str | None:
    """One variable of a process's environment, or None (absent or unreadable)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def owner_uid(pid: int, proc: Path = PROC) -> int | None:
    """The uid owning a process (its /proc directory), or None when it is gone."""
    try:
        return (proc / str(pid)).stat().st_uid
    except OSError:
        return None
