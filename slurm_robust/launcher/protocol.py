"""The agent-controller channel: JSON lines over one TCP connection per agent.

Level-triggered on purpose: every ``heartbeat_s`` an agent sends one ``report`` (its
node, the generation its workers run, worker exits, step progress, stack captures
done) and the controller answers with the agent's whole desired state, the ``plan``
(generation, role, ranks, rendezvous address, stack capture request), or, when the
report names the plan its agent already holds and that plan is still current, a short
"unchanged" (messages.Reply, control/replies.py: a plan's identity names the controller
incarnation that issued it). An agent that missed an answer loses nothing: the next
answer carries the plan again (a new connection starts by asking for it in full). The
report itself is the heartbeat; a connection that closes (the agent process died: the kernel
closes its sockets) is noticed at once, a silent one after ``heartbeat_timeout_s``.

One message goes the other way unasked: the *push*, the agent's new plan in full
(``{"plan": {...}, "plan_id": "...", "push": true}``). The controller sends it when an
agent's plan changed since its last answer (a failure began to settle, a new generation
was decided); the agent, waiting for its next heartbeat, applies it at once and goes on
waiting, instead of reporting to ask for it: at 4,096 agents a decision then costs the
controller 4,096 writes, not 4,096 reports to serve first. One writer (the controller's
report loop) keeps every message on a connection in the order the controller decided
it, so the last one an agent read always carries its newest plan: a push that arrives
while an agent waits for an answer is dropped, the answer after it being as new. A lost
push costs only the heartbeat it would have saved. An empty line (the *wake-up* of
earlier versions: report now) is still honoured on the agent's end.

Messages are bounded (MAX_MESSAGE) so that a confused peer cannot exhaust memory.

Security: other users of the cluster can reach the controller's port, so
every connection first passes the HMAC handshake of :mod:`slurm_robust.launcher.auth`
(both ends prove they hold the run's 0600 secret) within one total deadline
(:meth:`Channel.bounded`), the server binds to the job node's own address, accepts only
from the addresses of the job's nodes (:func:`job_node_addresses`), bounds the
unauthenticated connections per address and in all (control/admission.py) and the
authenticated ones (``max_connections``), and :func:`check_report` validates every
report before the controller reads it: a bad message closes that one connection (with
a log line); the run goes on.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import select
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from slurm_robust.launcher.messages import BadMessage
from slurm_robust.slurm.hostlist import expand_hostlist

log = logging.getLogger("slurm_robust.launcher.protocol")

MAX_MESSAGE = 4 << 20
#: Bound on a message before the peer has authenticated (the handshake is tiny).
MAX_UNAUTHENTICATED = 4096
#: Bounds on list fields of a report (per message).
MAX_ITEMS = 4096
#: A message as read off the wire: its keys are checked later, by check_report or the
#: typed messages (messages.py).
# open-ended: raw wire JSON, before anything has checked its keys
WireObject = dict[str, Any]


class ChannelClosed(ConnectionError):
    """The peer closed the connection or sent something that is not a message."""


# One refusal type for every message check (the typed messages raise it too).
__all__ = ["MAX_MESSAGE", "MAX_UNAUTHENTICATED", "BadMessage", "Channel", "ChannelClosed",
           "check_report", "host_address", "job_node_addresses"]


def _int(v: Any, lo: int = -1, hi: int = 1 << 31) -> bool:
    return type(v) is int and lo <= v <= hi


def _opt_num(v: Any) -> bool:
    return v is None or (type(v) in (int, float))


_EXIT_STR_FIELDS = ("class", "category")


def check_report(msg: WireObject, world_size: int) -> None:
    """Raise BadMessage unless ``msg`` is a well-formed agent report (every field the
    controller reads has the right type and range); malformed progress items are
    removed from ``msg``."""
    def bad(why: str) -> BadMessage:
        return BadMessage(f"bad report: {why}")

    if not isinstance(msg.get("key"), str) or not _int(msg.get("agent"), 0, 1 << 20):
        raise bad("key or agent")
    if not isinstance(msg.get("node"), str) or not _int(msg.get("pid"), 0):
        raise bad("node or pid")
    if not _int(msg.get("gen", -1)):
        raise bad("gen")
    for name, kind in (("states", dict), ("stacks", dict), ("exits", list),
                       ("progress", list)):
        v = msg.get(name)
        if v is not None and (not isinstance(v, kind) or len(v) > MAX_ITEMS):
            raise bad(name)
    for ex in msg.get("exits") or []:
        if not isinstance(ex, dict) or not _int(ex.get("gen")) \
                or not _int(ex.get("rank"), 0, max(world_size - 1, 0)):
            raise bad("exit record gen or rank")
        code = ex.get("exit_code")
        if code is not None and type(code) is not int:
            raise bad("exit record exit_code")
        if not _opt_num(ex.get("time")):
            raise bad("exit record time")
        if code != 0:
            if not all(isinstance(ex.get(f), str) for f in _EXIT_STR_FIELDS):
                raise bad("failed exit record without class and category")
            if ex.get("evidence") is not None and not isinstance(ex["evidence"], dict):
                raise bad("exit record evidence")
            if ex.get("time") is None:
                raise bad("failed exit record without time")
    # Progress items are the training script's own lines (relayed by the agent): a bad
    # one is dropped with a log line instead of costing the agent its connection.
    good = [item for item in msg.get("progress") or [] if _progress_ok(item, world_size)]
    if len(good) != len(msg.get("progress") or []):
        log.warning("dropped %d malformed progress item(s) from agent %s",
                    len(msg.get("progress") or []) - len(good), msg.get("agent"))
        msg["progress"] = good


def _progress_ok(item: Any, world_size: int) -> bool:
    if not isinstance(item, dict) or not _int(item.get("rank"), 0, max(world_size - 1, 0)):
        return False
    if item.get("kind", "step") == "step" and not _int(item.get("step"), 0, 1 << 62):
        return False
    return all(_opt_num(item.get(f)) for f in ("t", "loss", "grad_norm"))


def job_node_addresses(nodelist: str | None, own: str) -> set[str]:
    """IP addresses of the job's nodes (``SLURM_JOB_NODELIST``), for the controller's
    accept check. Names that DNS does not know are looked up as Slurm's NodeAddr.
    When a node's address is a loopback one (every node on one host), the host's own
    addresses count too. Empty when nodelist is None (no check: a run outside Slurm).
    """
    if not nodelist:
        return set()
    out = {own}
    for name in expand_hostlist(nodelist):
        addrs = _resolve(name)
        if not addrs:
            addr = _node_addr(name)
            addrs = _resolve(addr) if addr else set()
        if not addrs:
            log.warning("cannot resolve job node %s; agents from it will be refused", name)
        out |= addrs
    if any(ipaddress.ip_address(a).is_loopback for a in out):
        out.update({"127.0.0.1", own})
    return out


def _resolve(host: str) -> set[str]:
    try:
        return {i[4][0] for i in socket.getaddrinfo(host, None, socket.AF_INET)}
    except OSError:
        return set()


def _node_addr(name: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True,
                             text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or None
    return None


class Channel:
    """One JSON-lines connection (blocking, with a timeout on every call)."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.timeout_s = timeout_s
        self.sock.settimeout(timeout_s)
        #: time.monotonic() by which the current exchange must be over (see bounded()).
        self.deadline: float | None = None
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # a socketpair in tests
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""
        self.max_message = MAX_MESSAGE  # lowered by the server until the peer authenticates
        # A send from another thread must not interleave with one being written, nor
        # land on a descriptor number that close() has freed for reuse.
        self._send_lock = threading.Lock()
        self._closed = False
        #: Whether empty lines are wake-ups to skip: on the agent's end only. The
        #: controller's end refuses them, as any line that is not a message, so that a
        #: stranger cannot keep a connection slot by sending them before the handshake.
        self.wakeups = False

    @classmethod
    def connect(cls, host: str, port: int, timeout_s: float) -> Channel:
        chan = cls(socket.create_connection((host, port), timeout=timeout_s), timeout_s)
        chan.wakeups = True  # the agent's end: the controller may wake it
        return chan

    @contextmanager
    def bounded(self, seconds: float, max_message: int) -> Iterator[Channel]:
        """Within the block, every send and recv together must end within ``seconds``
        (a total deadline: a peer trickling one byte per timeout cannot stretch it) and a
        message is at most ``max_message`` bytes. For the handshake, before the peer has
        proved anything."""
        self.deadline, self.max_message = time.monotonic() + seconds, max_message
        try:
            yield self
        finally:
            self.deadline, self.max_message = None, MAX_MESSAGE
            try:
                self.sock.settimeout(self.timeout_s)
            except OSError:
                pass  # closed meanwhile

    def _arm(self) -> None:
        """Shorten the socket timeout to what is left before the deadline."""
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ChannelClosed("the peer did not finish the exchange in time")
        self.sock.settimeout(min(self.timeout_s, left))

    def send(self, message: Mapping[str, object]) -> None:
        self.send_encoded((json.dumps(message, separators=(",", ":"), default=str)
                           + "\n").encode())

    def send_encoded(self, data: bytes) -> None:
        """Send one message already encoded as ``send`` encodes it (one JSON line)."""
        with self._send_lock:
            self._arm()
            self.sock.sendall(data)

    def read_ready(self) -> tuple[bool, list[WireObject]]:
        """What the peer sent that can be read now, without blocking: whether a wake-up
        (an empty line) was among it, and the whole messages (a partial one stays
        buffered for ``recv``). ChannelClosed if the peer closed or sent a bad line."""
        poller = select.poll()  # the socket's own timeout would wait in recv
        poller.register(self.sock.fileno(), select.POLLIN)
        while poller.poll(0):
            self._read_chunk()
        woken, messages = False, []
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if not line:
                woken = True
                continue
            messages.append(_message(line))
        return woken, messages

    def _read_chunk(self) -> None:
        """One recv into the buffer: ChannelClosed at the peer's close or past the
        message bound."""
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ChannelClosed("peer closed the connection")
        self._buf += chunk
        if len(self._buf) > self.max_message:
            raise ChannelClosed(f"message over {self.max_message} bytes")

    def fileno(self) -> int:
        return self.sock.fileno()

    def has_input(self) -> bool:
        """Whether a message (or the peer's close) waits to be read, without reading it
        and without blocking; for another thread than the one that reads."""
        if b"\n" in self._buf:
            return True
        poller = select.poll()  # not select(): descriptors above 1024 at scale
        try:
            poller.register(self.sock.fileno(), select.POLLIN)
        except (OSError, ValueError):
            return False  # closed meanwhile
        return bool(poller.poll(0))

    def recv(self) -> WireObject:
        while True:
            if self.wakeups:
                self._buf = self._buf.lstrip(b"\n")  # nothing to answer
            while b"\n" not in self._buf:
                self._arm()
                self._read_chunk()
                if self.wakeups:
                    self._buf = self._buf.lstrip(b"\n")
            line, self._buf = self._buf.split(b"\n", 1)
            if line or not self.wakeups:
                break
        return _message(line)

    def request(self, message: Mapping[str, object]) -> WireObject:
        self.send(message)
        return self.recv()

    def close(self) -> None:
        with self._send_lock:
            self._closed = True
            try:
                self.sock.close()
            except OSError:
                pass


def _message(line: bytes) -> WireObject:
    """One received line as a JSON object (ChannelClosed for anything else)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nesting
        raise ChannelClosed(f"not a JSON message: {exc}") from exc
    if not isinstance(obj, dict):
        raise ChannelClosed("message is not a JSON object")
    return obj


def host_address() -> str:
    """This host's address as other nodes reach it (its hostname's, else loopback)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
