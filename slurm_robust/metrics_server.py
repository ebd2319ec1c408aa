"""A bounded HTTP server for one Prometheus registry: ``GET /metrics`` and nothing else.

prometheus_client's own ``start_http_server`` starts a thread per connection with no cap
and no timeout. Inside the controller (which lives in an agent) that is a way for any
user who reaches the port to take the agent down: about 1,200 idle connections exhausted
its descriptors. This server runs one thread and one selector, and bounds everything a
peer can hold:

- at most ``max_connections`` connections; at the cap the *oldest* is closed to make
  room, so idle connections cannot lock a scraper out (a scrape takes milliseconds);
- each connection has ``timeout_s`` in all, from accept to the last byte of the answer
  (a total deadline, so one byte every few seconds buys nothing);
- a request is at most ``MAX_REQUEST`` bytes; one request per connection
  (``Connection: close``);
- out of descriptors (EMFILE) at accept: the oldest connection is closed and the loop
  goes on; nothing ends the process.

The body is ``prometheus_client``'s exposition (``choose_encoder`` on the scraper's
Accept header: Prometheus text or OpenMetrics), generated in the server's thread.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger("slurm_robust.metrics_server")

MAX_CONNECTIONS = 64
TIMEOUT_S = 5.0
MAX_REQUEST = 8192
#: Environment variable naming the address the controller's endpoint binds to (default:
#: the job node's own address; never 0.0.0.0 unless a site asks for it).
BIND_ENV = "SLURM_ROBUST_METRICS_BIND"


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: memoryview | None = None


class BoundedMetricsServer:
    """Serve ``registry`` on ``host:port`` (0: a free port); see the module docstring."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int = 0,
                 max_connections: int = MAX_CONNECTIONS, timeout_s: float = TIMEOUT_S) -> None:
        self.registry = registry
        self.max_connections = max(1, max_connections)
        self.timeout_s = timeout_s
        self._listener = socket.create_server((host, port), backlog=128)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self.server_port = int(self.server_address[1])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._conns: OrderedDict[socket.socket, _Conn] = OrderedDict()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> BoundedMetricsServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True,
                                        name="slurm-robust-metrics")
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def server_close(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()
        self._sel.close()

    def connections(self) -> int:
        return len(self._conns)

    # ------------------------------------------------------------------ the loop
    def serve_forever(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            wait = min((c.deadline for c in self._conns.values()), default=now + 1.0) - now
            for key, events in self._sel.select(max(0.0, min(wait, 1.0))):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    continue
                else:
                    conn = self._conns.get(key.fileobj)  # type: ignore[call-overload]
                    if conn is not None:
                        self._step(conn, events)
            now = time.monotonic()
            for conn in [c for c in self._conns.values() if c.deadline <= now]:
                self._drop(conn)

    def _accept(self) -> None:
        for _ in range(64):  # a burst, but never starve the open connections
            try:
                sock, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # No descriptor for the newcomer: free one (the oldest) and go on.
                    if self._conns:
                        self._drop(next(iter(self._conns.values())))
                    else:
                        time.sleep(0.05)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue
                log.warning("metrics endpoint: accept failed: %s", exc)
                return
            while len(self._conns) >= self.max_connections:
                self._drop(next(iter(self._conns.values())))
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self.timeout_s)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, None)

    def _step(self, conn: _Conn, events: int) -> None:
        try:
            if conn.outbuf is not None:  # answering: the peer can take more bytes
                self._flush(conn)
                return
            data = conn.sock.recv(4096)
            if not data:
                self._drop(conn)
                return
            conn.inbuf += data
            if b"\r\n\r\n" in conn.inbuf or b"\n\n" in conn.inbuf:
                self._answer(conn)
            elif len(conn.inbuf) > MAX_REQUEST:
                self._reply(conn, 431, b"request too large\n", "text/plain")
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)

    def _answer(self, conn: _Conn) -> None:
        head = bytes(conn.inbuf).split(b"\n", 1)[0].decode("latin-1").strip()
        parts = head.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._reply(conn, 400, b"bad request\n", "text/plain")
            return
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._reply(conn, 405, b"only GET\n", "text/plain")
            return
        if target not in ("/metrics", "/"):
            self._reply(conn, 404, b"not found; try /metrics\n", "text/plain")
            return
        accept = ""
        for line in bytes(conn.inbuf).decode("latin-1").split("\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        try:
            encoder, content_type = choose_encoder(accept)
            body = encoder(self.registry)
        except Exception as exc:  # noqa: BLE001 - a collector's error is the scrape's, not ours
            log.warning("metrics endpoint: collecting failed: %s", exc)
            self._reply(conn, 500, b"collection failed\n", "text/plain")
            return
        self._reply(conn, 200, b"" if method == "HEAD" else body, content_type)

    def _reply(self, conn: _Conn, status: int, body: bytes, content_type: str) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large", 500: "Internal Server Error"}[status]
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        conn.outbuf = memoryview(head + body)
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, None)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.outbuf is not None and conn.outbuf.nbytes:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                return  # the selector says when the peer reads again
            conn.outbuf = conn.outbuf[sent:]
        self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def start_metrics_server(registry: CollectorRegistry, host: str, port: int = 0,
                         max_connections: int = MAX_CONNECTIONS,
                         timeout_s: float = TIMEOUT_S) -> BoundedMetricsServer:
    """Start serving ``registry`` (see :class:`BoundedMetricsServer`)."""
    return BoundedMetricsServer(registry, host, port, max_connections, timeout_s).start()
