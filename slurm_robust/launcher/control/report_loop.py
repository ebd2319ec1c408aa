"""The controller's reports, served from one thread for every agent connection.

A connection's handshake runs in a thread of its own (admission.py bounds how many), and
then the connection is handed here: one ``selectors`` loop reads the reports of every
agent, hands each round's reports to the controller in one batch (one lock acquisition
for many reports, not one per report) and writes the replies without blocking.

Why not a thread per connection, as before: at 4,096 agents (bench scale), 4,096 threads
each waited for the controller's lock and then for the interpreter's, a report cost
47 ms of controller CPU instead of under one, 32 of the 1,000 reports a second offered
were served, agents gave up on their answers, and 873 healthy ones were declared lost
when their connections closed. Here a report that has arrived is read within one round
of the loop, however many agents there are.

The wire is the channel's (protocol.py): JSON lines, one reply per report, and plans
pushed unasked when they change (``push``, from any thread: the loop writes them). The
loop is the only writer on its connections, so the order of what an agent reads is the
order in which the controller decided it: a push queued before a round is written before
that round's replies, one queued later after them, and the last message an agent reads
always carries its newest plan. Bounds as on the threaded path: a message over
``Channel.max_message`` bytes, a line that is not a JSON object, or silence for the
channel's timeout closes that connection.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.launcher.protocol import Channel

log = logging.getLogger("slurm_robust.launcher.control.report_loop")

#: How long one select waits when nothing happens (idle connections are checked then).
SELECT_S = 0.5
#: Reports the controller is handed at most per batch (one lock acquisition): a burst
#: of thousands is served in slices, so the tick loop waits for one slice at most.
BATCH_MAX = 256
#: A round that took longer than this pushes every connection's silence clock back
#: by its length (see _round).
BUSY_S = 0.05
#: Pushes encoded at a time, then written: the first agents have the plan while the
#: last ones' are encoded, and the shared rank map is looked up once per chunk.
PUSH_CHUNK = 256
#: A round of at least this many pushes is logged with its time (PUSHED_LINE).
PUSH_LOGGED = 64
PUSHED_LINE = "pushed"
#: Bytes read from a ready socket per round (a report is a few hundred bytes).
READ_BYTES = 65536


@dataclass(eq=False)
class Connection:
    """One authenticated agent connection, as the loop holds it."""

    chan: Channel
    peer: str
    #: Counted among the controller's authenticated connections (Controller._closed).
    counted: bool
    #: The agent it belongs to, once a report named it (the controller's AgentView).
    view: Any = None
    #: The last answer on it was late (the controller's LATE_ANSWER_S).
    late: bool = False
    last_input: float = field(default_factory=time.monotonic)
    #: Reply bytes the socket did not take yet (written when it is writable).
    out: bytes = b""
    closed: bool = False
    #: The identity of the last plan written on it (a reply's or a push's): a push of
    #: the same plan again is skipped.
    plan_id: str | None = None


@dataclass(frozen=True)
class Arrival:
    """One report read from a connection: the raw JSON object and when it arrived."""

    conn: Connection
    # open-ended: raw wire JSON; the typed messages (messages.py) check it
    raw: dict[str, Any]
    arrived: float


#: The controller's side: answers a batch of arrivals, in order, with the reply bytes
#: for each (None: close that connection after the replies before it).
ServeBatch = Callable[[Sequence[Arrival]], list[bytes | None]]
#: Called once for a connection that ended (its close is the controller's evidence).
OnClosed = Callable[[Connection, str], None]
#: Encodes plans to push, in order: each one's bytes (one JSON line) and its identity
#: (None: none). In one call for a round's pushes, which mostly share their rank map.
EncodePushes = Callable[[Sequence[Any]], list[tuple[bytes, str | None]]]
#: Called in the loop's thread once a pushed plan went to its connection's socket.
OnPushed = Callable[[Connection, Any], None]


class ReportLoop:
    """``add`` connections from any thread; ``start`` runs the loop in its own thread."""

    def __init__(self, serve_batch: ServeBatch, on_closed: OnClosed,
                 encode_pushes: EncodePushes, on_pushed: OnPushed | None = None) -> None:
        self._serve_batch = serve_batch
        self._on_closed = on_closed
        self._encode_pushes = encode_pushes
        self._on_pushed = on_pushed
        # open-ended: the plan objects are the controller's (encode_pushes reads them)
        self._pushes: deque[tuple[Connection, Any]] = deque()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._incoming: deque[Connection] = deque()
        self._incoming_lock = threading.Lock()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._conns: set[Connection] = set()
        self._last_idle_check = time.monotonic()

    # ------------------------------------------------------------------ any thread
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="robust-controller-reports")
        self._thread.start()

    def add(self, conn: Connection) -> None:
        """Serve ``conn`` from now on (its socket is made non-blocking here)."""
        conn.chan.sock.setblocking(False)
        with self._incoming_lock:
            self._incoming.append(conn)
        self._poke()

    def push(self, items: Sequence[tuple[Connection, Any]]) -> None:
        """Write each plan to its connection, unasked, from the loop's thread (encoded
        there, off the caller's lock); skipped where that plan was the last one written."""
        if not items:
            return
        with self._incoming_lock:
            self._pushes.extend(items)
        self._poke()

    def stop(self) -> None:
        """End the loop and close every connection it holds (no close callbacks: the
        controller is done with them)."""
        self._stop = True
        self._poke()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass  # full (a poke is already pending) or closed (stopped)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        try:
            while not self._stop:
                try:
                    self._round()
                except Exception:  # noqa: BLE001 - one bad round must not end the server
                    log.exception("controller report loop: a round failed")
                    time.sleep(0.05)
        finally:
            for conn in list(self._conns):
                self._drop(conn)
            self._sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _round(self) -> None:
        events = self._sel.select(SELECT_S)
        began = time.monotonic()
        # Before this round's reports are read and answered: a plan decided before them
        # reaches its agent before their replies (see the module docstring).
        self._write_pushes()
        arrivals: list[Arrival] = []
        for key, mask in events:
            conn = key.data
            if conn is None:
                self._take_incoming(arrivals)
                continue
            if mask & selectors.EVENT_WRITE:
                self._flush(conn)
            if mask & selectors.EVENT_READ and not conn.closed:
                self._read(conn, arrivals)
        for start in range(0, len(arrivals), BATCH_MAX):
            self._answer(arrivals[start:start + BATCH_MAX])
        now = time.monotonic()
        busy = now - began
        if busy > BUSY_S:
            # Time the loop spent answering (or waiting for the controller's lock, a
            # stalled tick) is not the agents' silence: they could not be read meanwhile.
            for conn in self._conns:
                conn.last_input += busy
        if now - self._last_idle_check >= SELECT_S:
            self._last_idle_check = now
            for conn in list(self._conns):
                if now - conn.last_input > conn.chan.timeout_s:
                    self._close(conn, "silent for the channel's timeout")

    def _take_incoming(self, arrivals: list[Arrival]) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass  # drained
        with self._incoming_lock:
            fresh, self._incoming = list(self._incoming), deque()
        for conn in fresh:
            if self._stop:
                conn.chan.close()
                continue
            conn.last_input = time.monotonic()
            self._conns.add(conn)
            try:
                self._sel.register(conn.chan.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError) as exc:  # closed meanwhile
                self._close(conn, f"could not watch the connection: {exc}")
                continue
            if b"\n" in conn.chan._buf:  # lines the handshake read ahead
                self._parse(conn, arrivals)

    def _write_pushes(self) -> None:
        with self._incoming_lock:
            if not self._pushes:
                return
            pushes, self._pushes = self._pushes, deque()
        if self._stop:
            return
        live = [(conn, plan) for conn, plan in pushes if not conn.closed]
        began = time.monotonic()
        for start in range(0, len(live), PUSH_CHUNK):
            chunk = live[start:start + PUSH_CHUNK]
            encoded = self._encode_pushes([plan for _, plan in chunk])
            for (conn, plan), (data, plan_id) in zip(chunk, encoded, strict=True):
                if conn.closed:  # a failed write on an earlier push of this round
                    continue
                if plan_id is not None and plan_id == conn.plan_id:
                    continue  # the agent has it already
                conn.plan_id = plan_id
                self._send(conn, data)
                if self._on_pushed is not None and not conn.closed:
                    self._on_pushed(conn, plan)
        if len(live) >= PUSH_LOGGED:
            # How long a decision took to leave the controller (the rest of its fan-out
            # is the network and the agents): bench scale reads this line.
            log.info("%s %d plans in %.3f s", PUSHED_LINE, len(live),
                     time.monotonic() - began)

    def _read(self, conn: Connection, arrivals: list[Arrival]) -> None:
        try:
            chunk = conn.chan.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, f"read failed: {exc}")
            return
        if not chunk:
            self._close(conn, "peer closed the connection")
            return
        conn.last_input = time.monotonic()
        chan = conn.chan
        chan._buf += chunk
        self._parse(conn, arrivals)
        if not conn.closed and len(chan._buf) > chan.max_message:
            self._close(conn, f"message over {chan.max_message} bytes")

    def _parse(self, conn: Connection, arrivals: list[Arrival]) -> None:
        chan = conn.chan
        arrived = time.time()
        while b"\n" in chan._buf:
            line, chan._buf = chan._buf.split(b"\n", 1)
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError) as exc:
                self._close(conn, f"not a JSON message: {exc}")
                return
            if not isinstance(obj, dict):
                self._close(conn, "message is not a JSON object")
                return
            arrivals.append(Arrival(conn, obj, arrived))

    def _answer(self, batch: Sequence[Arrival]) -> None:
        replies = self._serve_batch(batch)
        for arrival, reply in zip(batch, replies, strict=True):
            conn = arrival.conn
            if conn.closed:
                continue
            if reply is None:
                self._close(conn, "answered with a close")
                continue
            self._send(conn, reply)

    def _send(self, conn: Connection, data: bytes) -> None:
        if conn.out:  # behind bytes not yet written: in order
            conn.out += data
            return
        failed: str | None = None
        try:
            sent = conn.chan.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            sent, failed = len(data), f"write failed: {exc}"
        if sent < len(data):
            conn.out = data[sent:]
        if failed is not None:
            self._close(conn, failed)
        elif conn.out:
            self._watch(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def _flush(self, conn: Connection) -> None:
        failed: str | None = None
        try:
            sent = conn.chan.sock.send(conn.out)
            conn.out = conn.out[sent:]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            failed = f"write failed: {exc}"
        if failed is not None:
            self._close(conn, failed)
        elif not conn.out:
            self._watch(conn, selectors.EVENT_READ)

    def _watch(self, conn: Connection, events: int) -> None:
        try:
            self._sel.modify(conn.chan.sock, events, conn)
        except (KeyError, OSError, ValueError):
            pass  # closed meanwhile

    def _close(self, conn: Connection, why: str) -> None:
        if conn.closed:
            return
        self._drop(conn)
        try:
            self._on_closed(conn, why)
        except Exception:  # noqa: BLE001 - the loop serves the other agents regardless
            log.exception("controller report loop: closing a connection failed")

    def _drop(self, conn: Connection) -> None:
        conn.closed = True
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.chan.sock)
        except (KeyError, OSError, ValueError):
            pass
        if self._stop:
            conn.chan.close()

    def connections(self) -> int:
        return len(self._conns)


def detach(sock: socket.socket) -> socket.socket:
    """A new socket object for ``sock``'s connection, leaving ``sock`` without one: the
    threaded server's handler returns after the handshake and socketserver then shuts
    down and closes the request it passed in, which must not end the connection."""
    return socket.socket(sock.family, sock.type, sock.proto, fileno=sock.detach())
