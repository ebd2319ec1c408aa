"""Stack dumps: the data model, the parsers for py-spy and faulthandler text, and JSON.

A capture stores one file per rank, ``<run_dir>/stacks/<capture_id>/rank<r>.json``,
holding a :class:`RankDump`: the rank's worker process and its descendants (data-loader
workers, checkpoint writers), each a :class:`ProcessDump` with its threads. Frames are
listed innermost first, as both py-spy and faulthandler print them.

The parsers are pure functions over text so they can be tested on recorded output.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.records import write_json_atomic

DUMP_SCHEMA = "slurm_robust.stack_dump"
DUMP_VERSION = 1


class StackDumpError(SlurmRobustError):
    """A stored dump cannot be read (missing, not JSON, wrong schema)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame. ``line`` is 0 for native frames; ``file`` is the library there."""

    name: str
    file: str
    line: int = 0
    native: bool = False


@dataclass(slots=True)
class ThreadStack:
    tid: int | None
    name: str
    frames: list[Frame]
    main: bool = False
    state: str = ""


@dataclass(slots=True)
class ProcessDump:
    """The stacks of one process, or why there are none (``error``).

    ``error`` is ``None`` on success, else a short kind (``gone``, ``timeout``,
    ``permission``, ``not_python``, ``error``) and ``message`` holds the detail.
    """

    pid: int
    ppid: int | None
    role: str  # "worker" for the rank's process, "child" for a descendant
    method: str  # "py-spy" or "faulthandler"
    threads: list[ThreadStack] = field(default_factory=list)
    cmdline: str = ""
    duration_s: float = 0.0
    error: str | None = None
    message: str = ""

    def main_thread(self) -> ThreadStack | None:
        for thread in self.threads:
            if thread.main:
                return thread
        return self.threads[0] if self.threads else None


@dataclass(slots=True)
class RankDump:
    rank: int
    node: str
    pid: int
    time: float
    processes: list[ProcessDump]
    capture_id: str = ""

    @property
    def worker(self) -> ProcessDump | None:
        return next((p for p in self.processes if p.role == "worker"), None)


# --- py-spy text ---------------------------------------------------------------------

_PYSPY_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9a-fA-F]+|\d+) \((?P<state>[^)]*)\)'
                           r'(?:: "(?P<name>.*)")?\s*$')
_PYSPY_PROCESS = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


def parse_pyspy(text: str, pid: int | None = None) -> list[ThreadStack]:
    """Parse ``py-spy dump`` text output (with or without ``--native``).

    Frame lines look like ``    func (path/file.py:12)`` for Python and
    ``    func (libc.so.6)`` or ``    0x7fc1 (libc.so.6)`` for native frames. Deeper
    indented lines (``--locals``) and the header are skipped. The main thread is the
    one named ``MainThread`` or whose thread id is the process id.
    """
    threads: list[ThreadStack] = []
    current: ThreadStack | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        match = _PYSPY_PROCESS.match(line)
        if match and pid is None:
            pid = int(match["pid"])
            continue
        match = _PYSPY_THREAD.match(line)
        if match:
            tid = int(match["tid"], 0)
            name = match["name"] or ""
            current = ThreadStack(tid=tid, name=name, frames=[], state=match["state"],
                                  main=(name == "MainThread" or tid == pid))
            threads.append(current)
            continue
        if current is None or not line.startswith("    ") or line.startswith("     "):
            continue  # header, blank line, or a --locals detail line
        frame = _parse_pyspy_frame(line.strip())
        if frame is not None:
            current.frames.append(frame)
    return threads


def _parse_pyspy_frame(text: str) -> Frame | None:
    if not text.endswith(")") or " (" not in text:
        return None
    name, _, loc = text[:-1].rpartition(" (")
    file, sep, lineno = loc.rpartition(":")
    if sep and lineno.isdigit():
        return Frame(name=name, file=file, line=int(lineno), native=False)
    return Frame(name=name, file=loc, line=0, native=True)


def classify_pyspy_error(stderr: str) -> str:
    """Map py-spy's error text to a short kind used in signatures and reports."""
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text:
        return "permission"
    if "no such file" in text or "no such process" in text or "is the process running" in text:
        return "gone"
    if "failed to find python version" in text or "not a python" in text:
        return "not_python"
    return "error"


# --- faulthandler text ---------------------------------------------------------------

_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+|\d+)"
                        r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):\s*$")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<name>.*)$')
_FH_STACK_ONLY = re.compile(r"^Stack \(most recent call first\):\s*$")


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """Parse ``faulthandler.dump_traceback(all_threads=True)`` output.

    The main thread is the one whose outermost frame is ``<module>`` (the script or
    ``-m`` entry), else the ``Current thread`` (the one that handled the signal).
    Thread ids are pthread ids, not OS thread ids.
    """
    threads: list[ThreadStack] = []
    current_index: int | None = None
    for raw in text.splitlines():
        match = _FH_THREAD.match(raw)
        if match or _FH_STACK_ONLY.match(raw):
            tid = int(match["tid"], 0) if match else None
            threads.append(ThreadStack(tid=tid, name=(match["name"] or "") if match else "",
                                       frames=[]))
            if match is None or match["current"]:
                current_index = len(threads) - 1
            continue
        frame = _FH_FRAME.match(raw)
        if frame and threads:
            line = int(frame["line"]) if frame["line"].isdigit() else 0
            threads[-1].frames.append(Frame(name=frame["name"], file=frame["file"], line=line))
    main = next((t for t in threads if t.frames and t.frames[-1].name == "<module>"), None)
    if main is None and current_index is not None:
        main = threads[current_index]
    if main is not None:
        main.main = True
    return threads


# --- JSON ----------------------------------------------------------------------------

def rank_dump_to_json(dump: RankDump) -> dict[str, Any]:
    return {
        "schema": DUMP_SCHEMA, "v": DUMP_VERSION, "time": dump.time,
        "capture_id": dump.capture_id, "rank": dump.rank, "node": dump.node, "pid": dump.pid,
        "processes": [_process_to_json(p) for p in dump.processes],
    }


def _process_to_json(proc: ProcessDump) -> dict[str, Any]:
    return {
        "pid": proc.pid, "ppid": proc.ppid, "role": proc.role, "method": proc.method,
        "cmdline": proc.cmdline, "duration_s": round(proc.duration_s, 4),
        "error": proc.error, "message": proc.message,
        "threads": [{"tid": t.tid, "name": t.name, "main": t.main, "state": t.state,
                     "frames": [[f.name, f.file, f.line, f.native] for f in t.frames]}
                    for t in proc.threads],
    }


def rank_dump_from_json(obj: Mapping[str, Any]) -> RankDump:
    """Build a RankDump from its JSON form; raises StackDumpError on a wrong schema."""
    if obj.get("schema") != DUMP_SCHEMA:
        raise StackDumpError(f"not a stack dump (schema {obj.get('schema')!r}, "
                             f"expected {DUMP_SCHEMA!r})")
    try:
        processes = [
            ProcessDump(pid=int(p["pid"]), ppid=p.get("ppid"), role=str(p["role"]),
                        method=str(p.get("method", "")), cmdline=str(p.get("cmdline", "")),
                        duration_s=float(p.get("duration_s", 0.0)), error=p.get("error"),
                        message=str(p.get("message", "")),
                        threads=[ThreadStack(tid=t.get("tid"), name=str(t.get("name", "")),
                                             main=bool(t.get("main")),
                                             state=str(t.get("state", "")),
                                             frames=[Frame(str(f[0]), str(f[1]), int(f[2]),
                                                           bool(f[3])) for f in t["frames"]])
                                 for t in p.get("threads", [])])
            for p in obj["processes"]]
        return RankDump(rank=int(obj["rank"]), node=str(obj["node"]), pid=int(obj["pid"]),
                        time=float(obj["time"]), processes=processes,
                        capture_id=str(obj.get("capture_id", "")))
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise StackDumpError(f"malformed stack dump: {exc!r}") from exc


def write_rank_dump(directory: str | os.PathLike[str], dump: RankDump) -> Path:
    """Write ``rank<r>.json`` atomically into a capture directory; returns its path."""
    path = Path(directory) / f"rank{dump.rank}.json"
    write_json_atomic(path, rank_dump_to_json(dump))
    return path


def read_capture(directory: str | os.PathLike[str]) -> list[RankDump]:
    """Read every ``rank<r>.json`` of a capture directory, ordered by rank.

    Raises StackDumpError when the directory holds no dumps or one is unreadable.
    """
    directory = Path(directory)
    paths = sorted(directory.glob("rank*.json"))
    if not paths:
        raise StackDumpError(f"no rank*.json dumps in {directory}; run "
                             f"'slurm-robust stacks capture' first or check the path")
    dumps = []
    for path in paths:
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise StackDumpError(f"cannot read {path}: {exc}") from exc
        try:
            dumps.append(rank_dump_from_json(obj))
        except StackDumpError as exc:
            raise StackDumpError(f"{path}: {exc}") from exc
    return sorted(dumps, key=lambda d: d.rank)


def is_address(name: str) -> bool:
    """True for a bare native address such as ``0x7fc15fa4524a``."""
    return bool(_ADDRESS.match(name))
