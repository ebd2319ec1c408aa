"""The agent's side of its fork server (forkserver.py): start it, order workers, track them.

A worker the server forks is a :class:`ServedProcess`: the subset of ``subprocess.Popen``
the agent uses (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``), fed by
the server's events. Orders never block the agent: they are queued on a non-blocking
pipe, so the first generation is ordered while the server still imports torch and
starts as soon as it is ready; until then its pid is None (the worker is *pending*). A
pending worker that is stopped is cancelled (never started, or killed at once) and
counts as ended at once, SIGKILLed, whether or not the server has answered.

When the server dies, every worker it had not reported is taken as killed (SIGKILL:
they die with it) and later workers start with a plain exec.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

from slurm_robust.launcher.node import worker_order
from slurm_robust.launcher.node.worker_order import WorkerOrder

log = logging.getLogger(__name__)

#: A worker whose exit the kernel shows but whose status the server has not sent yet
#: is waited for this long (the server sends it within milliseconds).
EXIT_EVENT_WAIT_S = 2.0


class ServedProcess:
    """One worker forked by the fork server, seen through its events."""

    def __init__(self, server: ForkServer, ident: int) -> None:
        self.server = server
        self.ident = ident
        #: None while the order waits for the server (pending).
        self.pid: int | None = None
        self.returncode: int | None = None
        self.cancelled = False
        self.signals: list[int] = []  # sent while pending: delivered once it starts

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump()
        if self.returncode is None and self.pid is not None and _gone(self.pid):
            # Exited (a zombie the server keeps for us): its status is on the way.
            self.server.pump(EXIT_EVENT_WAIT_S, until=lambda: self.returncode is not None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.server.argv, timeout or 0.0)
            self.server.pump(min(0.5, left), until=lambda: self.returncode is not None)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        if self.pid is None:
            if sig in (signal.SIGTERM, signal.SIGKILL):
                # Ended now, without waiting for the server (it may still be importing
                # for seconds: the agent must not miss its heartbeats over a worker that
                # never ran). The server drops the order, or kills the fork at once if it
                # started it meanwhile; its exit is still reaped then (_event).
                self.cancelled = True
                self.returncode = -signal.SIGKILL
                self.server.send("cancel", id=self.ident)
            else:
                self.signals.append(sig)
            return
        try:
            # Safe: the server reaps this pid only after our ``reap``, sent once we
            # hold its exit status (and then poll() above returned it).
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def started(self, pid: int) -> None:
        self.pid = pid
        for sig in self.signals:
            self.send_signal(sig)
        self.signals.clear()


class ForkServer:
    """This agent's fork server (see forkserver.py); ``enabled`` only for a command that
    runs this interpreter (worker_order.usable) and a non-empty ``preload``."""

    def __init__(self, command: list[str] | tuple[str, ...], preload: tuple[str, ...],
                 env: Mapping[str, str]) -> None:
        self.enabled = bool(preload) and worker_order.usable(command)
        self.argv = [command[0], "-m", "slurm_robust.launcher.node.forkserver", *preload]
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_at: float | None = None
        #: "fork", or "exec" when its pre-imports initialised CUDA (forkserver.py).
        self.mode: str | None = None
        self.started_at: float | None = None
        self.dead = False
        self.inbox = b""
        self.outbox = b""
        self.next_id = 0
        self.by_id: dict[int, ServedProcess] = {}
        self.by_pid: dict[int, ServedProcess] = {}

    def start(self) -> None:
        if not self.enabled or self.proc is not None:
            return
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.started_at = time.time()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        os.set_blocking(self.proc.stdin.fileno(), False)
        os.set_blocking(self.proc.stdout.fileno(), False)

    @property
    def usable(self) -> bool:
        return self.proc is not None and not self.dead

    def fileno(self) -> int | None:
        """The events pipe (readable when the server has news), None when unusable."""
        if not self.usable or self.proc is None or self.proc.stdout is None:
            return None
        return self.proc.stdout.fileno()

    def spawn(self, order: WorkerOrder) -> ServedProcess | None:
        """Order one worker; None when there is no usable server (start it plainly)."""
        if not self.usable:
            return None
        self.next_id += 1
        proc = ServedProcess(self, self.next_id)
        self.by_id[proc.ident] = proc
        self.send("spawn", id=proc.ident, order=order.to_json())
        self.pump()
        return proc

    def send(self, op: str, **fields: object) -> None:
        self.outbox += (json.dumps({"op": op, **fields}) + "\n").encode()
        self._flush()

    def pump(self, timeout_s: float = 0.0, until: Callable[[], bool] | None = None) -> None:
        """Send what is queued and take the server's events; with ``timeout_s``, wait
        up to that long for events (until ``until()`` holds, when given)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._flush()
            self._receive()
            left = deadline - time.monotonic()
            if self.dead or left <= 0 or (until is not None and until()):
                return
            fd = self.fileno()
            if fd is None:
                return
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(left * 1000.0)

    def close(self) -> None:
        """End the server (after the agent stopped its workers)."""
        if self.proc is None:
            return
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.dead = True

    # ------------------------------------------------------------------ internals
    def _flush(self) -> None:
        if not self.outbox or not self.usable or self.proc is None or self.proc.stdin is None:
            return
        try:
            sent = os.write(self.proc.stdin.fileno(), self.outbox)
            self.outbox = self.outbox[sent:]
        except BlockingIOError:
            pass  # the server is still importing: the rest goes on the next pump
        except OSError:
            self._died("its order pipe closed")

    def _receive(self) -> None:
        if not self.usable or self.proc is None or self.proc.stdout is None:
            return
        while True:
            try:
                data = os.read(self.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            except OSError as exc:
                self._died(str(exc))
                return
            if not data:
                self._died(f"it ended (status {self.proc.poll()})")
                return
            self.inbox += data
        *lines, self.inbox = self.inbox.split(b"\n")
        for line in lines:
            if line.strip():
                try:
                    self._event(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    self._died(f"it sent {line[:200]!r} ({exc})")
                    return

    def _event(self, event: Mapping[str, int | str]) -> None:
        op = event["op"]
        if op == "ready":
            self.ready_at = time.time()
            self.mode = str(event.get("mode", "fork"))
            log.info("fork server ready after %.1f s of import (%s, %s thread(s)), %d "
                     "order(s) waiting", self.ready_at - (self.started_at or self.ready_at),
                     self.mode, event.get("threads", "?"), len(self.by_id))
            if self.mode == "exec":
                log.warning("fork server %s: its pre-imports (%s) initialised CUDA, which "
                            "a fork cannot use: every worker starts as a fresh interpreter "
                            "(drop the module that touches the GPU from prewarm)",
                            self.argv[0], " ".join(self.argv[3:]))
        elif op == "started":
            proc = self.by_id.pop(int(event["id"]))
            self.by_pid[int(event["pid"])] = proc
            log.info("fork server: order %s started as pid %s", proc.ident, event["pid"])
            proc.started(int(event["pid"]))
        elif op in ("failed", "cancelled"):
            proc = self.by_id.pop(int(event["id"]))
            if not proc.cancelled:
                proc.returncode = 1 if op == "failed" else -signal.SIGKILL
        elif op == "exited":
            pid = int(event["pid"])
            proc = self.by_pid.pop(pid)
            if not proc.cancelled:
                proc.returncode = int(event["returncode"])
            self.send("reap", pid=pid)

    def _died(self, why: str) -> None:
        if self.dead:
            return
        self.dead = True
        lost = list(self.by_id.values()) + list(self.by_pid.values())
        log.warning("fork server %s: %s; %d worker(s) taken as killed, the next ones "
                    "start with a plain exec", self.argv[0], why, len(lost))
        for proc in lost:
            proc.returncode = -signal.SIGKILL  # PR_SET_PDEATHSIG: they died with it
        self.by_id.clear()
        self.by_pid.clear()


def _gone(pid: int) -> bool:
    """Whether ``pid`` is a zombie (exited; the server has not been told to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except OSError:
        return False
