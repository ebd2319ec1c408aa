"""Take a stack dump of every worker of a job on this machine, and of their children.

Given ``{rank: pid}`` for the workers on one node, :func:`capture_local` finds each
worker's descendants through /proc (data-loader and checkpoint processes: the main process
alone is not enough: section 3 of the ByteRobust paper cited in README.md), dumps all of
them in parallel under one time budget, and writes ``<out_dir>/rank<r>.json`` per rank
plus ``node-<node>.json``, a summary of the capture on that node.

Methods (``CaptureOptions.method``):

``py-spy``
    ``py-spy dump --pid P --full-filenames [--native]``; needs ptrace.
``faulthandler``
    send the signal registered by :func:`slurm_robust.stacks.handler.install_stack_dump_handler`
    and read what the process appended to its file. A process that does not catch
    the signal is never sent it (the default action would kill it).
``auto`` (default)
    py-spy, and faulthandler for any process py-spy is not allowed to read.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.records import write_json_atomic
from slurm_robust.stacks import procfs
from slurm_robust.stacks.dumps import (
    ProcessDump,
    RankDump,
    classify_pyspy_error,
    parse_faulthandler,
    parse_pyspy,
    write_rank_dump,
)
from slurm_robust.stacks.handler import DEFAULT_SIGNAL, handler_path

METHODS = ("auto", "py-spy", "faulthandler")
CAPTURE_SCHEMA = "slurm_robust.stack_capture"
CAPTURE_VERSION = 1
# How long a faulthandler file must stop growing before its dump counts as complete.
_FH_SETTLE_S = 0.05


@dataclass(frozen=True)
class CaptureOptions:
    """How to capture.

    method: ``auto``, ``py-spy`` or ``faulthandler`` (see the module doc).
    native: ask py-spy for native frames too (about 1 s more per torch process).
    children: dump the workers' descendants as well.
    budget_s: wall-time budget of the whole capture on this node.
    per_process_s: timeout of one dump (py-spy on a process stuck in the kernel hangs).
    parallel: dumps run at once.
    pyspy: the py-spy binary; default: next to the running Python, else on PATH.
    faulthandler_template: where the handler writes, with ``{pid}`` and ``{node}``
        (see :func:`~slurm_robust.stacks.handler.install_stack_dump_handler`);
        None disables the fallback.
    signal: the faulthandler signal.
    """

    method: str = "auto"
    native: bool = False
    children: bool = True
    budget_s: float = 10.0
    per_process_s: float = 5.0
    parallel: int = 16
    pyspy: str | None = None
    faulthandler_template: str | None = None
    signal: int = DEFAULT_SIGNAL

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"capture: method must be one of {METHODS}, got {self.method!r}")
        if self.method == "faulthandler" and not self.faulthandler_template:
            raise UsageError("capture: method 'faulthandler' needs faulthandler_template "
                             "(where install_stack_dump_handler writes)")
        if self.budget_s <= 0 or self.per_process_s <= 0 or self.parallel < 1:
            raise UsageError("capture: budget_s, per_process_s and parallel must be positive")


@dataclass
class CaptureResult:
    capture_id: str
    directory: Path
    node: str
    dumps: list[RankDump]
    duration_s: float

    def summary(self) -> dict[str, Any]:
        errors: dict[str, int] = {}
        methods: dict[str, int] = {}
        processes = 0
        for dump in self.dumps:
            for proc in dump.processes:
                processes += 1
                methods[proc.method] = methods.get(proc.method, 0) + 1
                if proc.error:
                    errors[proc.error] = errors.get(proc.error, 0) + 1
        return {"schema": CAPTURE_SCHEMA, "v": CAPTURE_VERSION, "time": time.time(),
                "capture_id": self.capture_id, "node": self.node,
                "ranks": sorted(d.rank for d in self.dumps), "processes": processes,
                "methods": methods, "errors": errors,
                "duration_s": round(self.duration_s, 3)}


def new_capture_id(now: float | None = None) -> str:
    """A sortable id: UTC time plus the pid of the capturing process."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{os.getpid()}"


def find_pyspy(explicit: str | None = None) -> str | None:
    """The py-spy binary: explicit, next to this Python (the venv), or on PATH."""
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


@dataclass(frozen=True)
class _Target:
    rank: int
    pid: int
    ppid: int | None
    role: str


def capture_local(workers: Mapping[int, int], node: str, out_dir: str | os.PathLike[str],
                  options: CaptureOptions | None = None,
                  capture_id: str | None = None) -> CaptureResult:
    """Dump the workers ``{rank: pid}`` running on this machine and their children.

    Writes one ``rank<r>.json`` per rank and ``node-<node>.json`` into ``out_dir``.
    A process that cannot be dumped is recorded with its error (that is evidence too:
    a rank whose dump times out is often the stuck one); nothing here raises for one
    bad process. Raises UsageError for an empty worker map.
    """
    options = options or CaptureOptions()
    if not workers:
        raise UsageError(f"capture: no worker pids given for node {node}")
    capture_id = capture_id or new_capture_id()
    start = time.monotonic()
    deadline = start + options.budget_s
    targets = _targets(workers, options.children)
    dump_one = _dumper(options, deadline)
    with ThreadPoolExecutor(max_workers=min(options.parallel, len(targets))) as pool:
        results = list(pool.map(dump_one, targets))
    now = time.time()
    dumps = []
    for rank, pid in sorted(workers.items()):
        procs = [r for t, r in zip(targets, results, strict=True) if t.rank == rank]
        dumps.append(RankDump(rank=rank, node=node, pid=pid, time=now, processes=procs,
                              capture_id=capture_id))
    out = Path(out_dir)
    for dump in dumps:
        write_rank_dump(out, dump)
    result = CaptureResult(capture_id, out, node, dumps, time.monotonic() - start)
    write_json_atomic(out / f"node-{node}.json", result.summary())
    return result


def _targets(workers: Mapping[int, int], children: bool) -> list[_Target]:
    tree = procfs.descendants(workers.values()) if children else {}
    targets = []
    for rank, pid in sorted(workers.items()):
        targets.append(_Target(rank, pid, procfs.read_ppid(pid), "worker"))
        for child, parent in tree.get(pid, []):
            targets.append(_Target(rank, child, parent, "child"))
    return targets


def _dumper(options: CaptureOptions,
            deadline: float) -> Callable[[_Target], ProcessDump]:
    pyspy = find_pyspy(options.pyspy)

    def dump_one(target: _Target) -> ProcessDump:
        proc = ProcessDump(pid=target.pid, ppid=target.ppid, role=target.role,
                           method=options.method, cmdline=procfs.cmdline(target.pid))
        began = time.monotonic()
        if options.method in ("auto", "py-spy"):
            _dump_pyspy(proc, pyspy, options, deadline)
        fallback = options.method == "faulthandler" or (
            options.method == "auto" and proc.error in ("permission", "no_pyspy")
            and options.faulthandler_template is not None)
        if fallback:
            _dump_faulthandler(proc, options, deadline)
        proc.duration_s = time.monotonic() - began
        return proc

    return dump_one


def _dump_pyspy(proc: ProcessDump, pyspy: str | None, options: CaptureOptions,
                deadline: float) -> None:
    proc.method = "py-spy"
    if pyspy is None:
        proc.error, proc.message = "no_pyspy", "py-spy not found next to Python or on PATH"
        return
    timeout = min(options.per_process_s, deadline - time.monotonic())
    if timeout <= 0:
        proc.error, proc.message = "timeout", "capture budget spent before this process"
        return
    argv = [pyspy, "dump", "--pid", str(proc.pid), "--full-filenames"]
    if options.native:
        argv.append("--native")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        proc.error, proc.message = "timeout", f"py-spy did not answer within {timeout:.1f} s"
        return
    except OSError as exc:  # the binary is missing or not executable
        proc.error, proc.message = "no_pyspy", f"cannot run {pyspy}: {exc}"
        return
    if done.returncode != 0:
        proc.error = classify_pyspy_error(done.stderr + done.stdout)
        if proc.error == "not_python" and not procfs.exists(proc.pid):
            proc.error = "gone"
        proc.message = _first_line(done.stderr or done.stdout)
        return
    proc.threads = parse_pyspy(done.stdout, pid=proc.pid)


def _dump_faulthandler(proc: ProcessDump, options: CaptureOptions,
                       deadline: float) -> None:
    proc.method, proc.error, proc.message = "faulthandler", None, ""
    template = options.faulthandler_template or ""
    # The process named its file with the node name it saw itself (handler.node_name).
    own_node = procfs.environ_value(proc.pid, "SLURMD_NODENAME") or socket.gethostname()
    path = handler_path(template, proc.pid, own_node)
    if not path.exists() or not procfs.catches_signal(proc.pid, options.signal):
        gone = not procfs.exists(proc.pid)
        proc.error = "gone" if gone else "no_handler"
        proc.message = ("process ended" if gone else
                        f"no stack dump handler (file {path}); the training code must call "
                        "install_stack_dump_handler")
        return
    offset = path.stat().st_size
    try:
        os.kill(proc.pid, options.signal)
    except ProcessLookupError:
        proc.error, proc.message = "gone", "process ended"
        return
    text = _read_growth(path, offset, min(deadline, time.monotonic() + options.per_process_s))
    if not text:
        proc.error, proc.message = "timeout", f"nothing written to {path} after the signal"
        return
    proc.threads = parse_faulthandler(text)


def _read_growth(path: Path, offset: int, until: float) -> str:
    """Wait for ``path`` to grow past ``offset`` and settle; return the new text."""
    size, settled_at = offset, None
    while time.monotonic() < until:
        current = path.stat().st_size
        if current != size:
            size, settled_at = current, time.monotonic()
        elif settled_at is not None and time.monotonic() - settled_at >= _FH_SETTLE_S:
            break
        time.sleep(0.01)
    if size <= offset:
        return ""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size - offset).decode(errors="replace")


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""
