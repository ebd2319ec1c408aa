"""The fork server: one interpreter per agent that imports torch once and forks workers.

Every worker used to start in a *zygote*: a pre-started interpreter per local rank that
had imported torch, consumed by one worker and refilled afterwards. Each refill imported
torch again (3-4 s of CPU on this 2-core machine, with torch._dynamo), after the first
step and after every restart, on every node; on a 2-core test node that was half of
the CPU a killed-worker rehearsal used. A fork server imports the ``prewarm`` modules
once, at the agent's start, and every worker of every generation is a fork of it: a
restart costs a fork (milliseconds), whatever the number of restarts.

``python -m slurm_robust.launcher.node.forkserver MODULE...`` imports the modules, then
speaks JSON lines: orders on stdin, events on stdout.

    agent -> server   {"op": "spawn", "id": n, "order": {"argv", "env", "cwd", "log"}}
                      {"op": "cancel", "id": n}      (stopped before it started)
                      {"op": "reap", "pid": p}       (the agent has the exit status)
    server -> agent   {"op": "ready", "mode": "fork"|"exec", "threads": n}
                                                     (the modules are imported; n: the
                                                     server's threads, itself included)
                      {"op": "started", "id": n, "pid": p}
                      {"op": "failed", "id": n, "error": "..."}  (also in the rank's log)
                      {"op": "cancelled", "id": n}
                      {"op": "exited", "pid": p, "returncode": r}  (Popen's convention)

The workers are the server's children, not the agent's. The server learns an exit with
``waitid(WNOWAIT)`` and leaves the child a zombie until the agent answers ``reap``, so a
pid the agent signals or watches (pidfd) is never a reused one. Workers die with the
server (PR_SET_PDEATHSIG): a worker nobody can report on is worse than a lost one. The
server ignores the signals Slurm sends a whole step (SIGTERM, the time-limit warning,
SIGINT, SIGHUP): they are for the agent and the workers, which get them directly (all
stay in the agent's process group); each fork gets back a fresh interpreter's handlers.
When the agent closes the channel (its end) the server waits for its workers, then ends.

A pre-import that initialised CUDA (a prewarm module that touches the device) would
leave every fork unable to use it ("Cannot re-initialize CUDA in forked subprocess"):
such a server says ``"mode": "exec"`` and each fork execs a fresh interpreter instead,
slower but correct; the agent logs it once.

The modules are imported on the main thread, the one every worker is forked from. An
earlier version imported them on a thread of its own (so that a parked spare could lower
that thread's priority) and forked right after joining it: the thread's task outlives
``Thread.join`` by 0-4 ms (measured here: /proc/self/task still lists it), still running
its exit path (thread-local destructors of the imported C++ libraries), and a fork in
that window copies whatever lock that path holds into the child, held for ever. Its
forked workers stalled in their first step about once per suite run. Importing on the
main thread leaves no such window: at ``ready`` the only other threads are the ones the
modules keep for good (numpy's OpenBLAS pool, which shuts itself down around a fork with
its own pthread_atfork handler); their count goes with ``ready`` into the agent's log.
Orders come from this agent alone (a pipe of its own child): no other user reaches it.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import select
import signal
import sys
from collections.abc import Mapping
from typing import Any

from slurm_robust.launcher.node import worker_order
from slurm_robust.launcher.node.worker_order import WorkerOrder

#: The signals Slurm delivers to every process of a step; the server outlives them.
STEP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1
READ_CHUNK = 1 << 20


def die_with_parent() -> None:
    """SIGKILL this process when its parent ends (Linux prctl; a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def exit_returncode(info: os.waitid_result) -> int:
    """A waitid result as Popen's returncode (negative: killed by that signal)."""
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


class Server:
    """The serving loop; ``serve`` returns only in a fresh fork, with its order."""

    def __init__(self, handlers: Mapping[int, Any], orders_fd: int = 0,
                 events_fd: int = 1, mode: str = "fork") -> None:
        self.mode = mode
        self.orders_fd = orders_fd
        self.events_fd = events_fd
        #: A fresh interpreter's handlers of STEP_SIGNALS, given back to every fork.
        self.handlers = dict(handlers)
        #: Running (or exited, unreaped) children: pid -> pidfd (None without pidfds).
        self.children: dict[int, int | None] = {}
        self.pids: dict[int, int] = {}  # order id -> pid
        self.exited: set[int] = set()  # reported, waiting for the agent's reap
        self.buffer = b""
        self.closing = False

    def emit(self, op: str, **fields: int | str) -> None:
        os.write(self.events_fd, (json.dumps({"op": op, **fields}) + "\n").encode())

    def serve(self) -> WorkerOrder:
        self.emit("ready", mode=self.mode, threads=thread_count())
        while True:
            watched = [fd for fd in self.children.values() if fd is not None]
            if not self.closing:
                watched.append(self.orders_fd)
            poller = select.poll()
            for fd in watched:
                poller.register(fd, select.POLLIN)
            # Without pidfds an exit is only seen by polling: every 50 ms.
            blind = any(fd is None for pid, fd in self.children.items()
                        if pid not in self.exited)
            poller.poll(50 if blind else 1000)
            if not self.closing:
                order = self._read_orders()
                if order is not None:
                    return order
            self._check_exits()
            if self.closing and not self.children:
                os._exit(0)

    def _read_orders(self) -> WorkerOrder | None:
        try:
            data = os.read(self.orders_fd, READ_CHUNK)
        except BlockingIOError:
            return None
        if not data:
            # The agent ended: no more orders; wait for the workers (Slurm ends them).
            # Those whose exit it was told of but had not answered with ``reap`` (a
            # cancelled fork it counted as ended at once) are reaped now: nobody else will.
            self.closing = True
            for pid in list(self.exited):
                self._reap(pid)
            return None
        self.buffer += data
        *lines, self.buffer = self.buffer.split(b"\n")
        # Only this agent writes here (its own child's pipe): a malformed line is a bug,
        # and the server ends on it (its workers with it) rather than guess.
        messages = [_message(line) for line in lines if line.strip()]
        cancelled = {m["id"] for m in messages if m["op"] == "cancel"}
        for m in messages:
            ident = _int(m, "id") if m["op"] in ("spawn", "cancel") else 0
            if m["op"] == "spawn":
                if ident in cancelled:
                    self.emit("cancelled", id=ident)
                    continue
                raw = m.get("order")
                order = WorkerOrder.from_json(raw if isinstance(raw, Mapping) else {})
                if self._fork(ident, order):
                    return order  # in the child: become the worker
            elif m["op"] == "cancel" and ident in self.pids:
                pid = self.pids[ident]
                if pid in self.children and pid not in self.exited:
                    os.kill(pid, signal.SIGKILL)
            elif m["op"] == "reap":
                self._reap(_int(m, "pid"))
        return None

    def _fork(self, ident: int, order: WorkerOrder) -> bool:
        """Fork the worker of ``order``; True in the child."""
        me = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            self._refuse(ident, order, f"fork failed: {exc}")
            return False
        if pid == 0:
            self._become_child(me)
            return True
        try:
            fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        self.children[pid] = fd
        self.pids[ident] = pid
        self.emit("started", id=ident, pid=pid)
        return False

    def _become_child(self, server_pid: int) -> None:
        for fd in self.children.values():
            if fd is not None:
                os.close(fd)
        self.children.clear()
        for s, handler in self.handlers.items():
            signal.signal(s, handler)
        die_with_parent()
        if os.getppid() != server_pid:
            os._exit(1)  # the server died before the line above: nobody would report us
        # The order's log and /dev/null replace the channels (fds 1 and 0): run_order.

    def _refuse(self, ident: int, order: WorkerOrder, error: str) -> None:
        try:
            fd = os.open(order.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                         os.O_NOFOLLOW, 0o600)
            os.write(fd, f"slurm-robust fork server: the worker did not start: {error}\n"
                     .encode())
            os.close(fd)
        except OSError:
            pass
        self.emit("failed", id=ident, error=error)

    def _check_exits(self) -> None:
        for pid in [p for p in self.children if p not in self.exited]:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
                self.children.pop(pid)
            if info is None:
                continue
            fd = self.children[pid]
            if fd is not None:
                os.close(fd)
                self.children[pid] = None
            self.exited.add(pid)
            if self.closing:
                self._reap(pid)  # nobody to tell
            else:
                self.emit("exited", pid=pid, returncode=exit_returncode(info))

    def _reap(self, pid: int) -> None:
        if pid not in self.exited:
            return  # not ours, or not exited: the agent never reaps a live worker
        self.exited.discard(pid)
        self.children.pop(pid, None)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _message(line: bytes) -> Mapping[str, object]:
    obj = json.loads(line)
    if not isinstance(obj, dict) or obj.get("op") not in ("spawn", "cancel", "reap"):
        raise ValueError(f"fork server: not an order: {line[:200]!r}")
    return obj


def _int(message: Mapping[str, object], key: str) -> int:
    value = message.get(key)
    if not isinstance(value, int):
        raise ValueError(f"fork server: {key} is not a number in {dict(message)}")
    return value


def preload(names: list[str]) -> None:
    """Import ``names`` on this (the main) thread: see the docstring for why not on
    another."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the worker will import it (and fail) itself if it needs it


def thread_count() -> int:
    """This process's threads (tasks), itself included; 0 where /proc cannot tell."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def main() -> None:
    # The agent's end (even a SIGKILL) ends the server, and with it the workers.
    die_with_parent()
    # Ignored from the start: a SIGTERM during the import would end the server with the
    # first generation's orders in its pipe.
    handlers = {s: signal.signal(s, signal.SIG_IGN) for s in STEP_SIGNALS}
    preload(sys.argv[1:])
    os.set_blocking(0, False)
    torch = sys.modules.get("torch")
    poisoned = bool(torch is not None and torch.cuda.is_initialized())
    order = Server(handlers, mode="exec" if poisoned else "fork").serve()
    if poisoned:
        worker_order.exec_order(order)
    else:
        worker_order.run_order(order)


if __name__ == "__main__":
    main()
