"""The agent-controller channel: JSON lines over one TCP connection per agent.

Level-triggered on purpose: every ``heartbeat_s`` an agent sends one ``report`` (its
node, the generation its workers run, worker exits, step progress, stack captures
done) and the controller answers with the agent's whole desired state, the ``plan``
(generation, role, ranks, rendezvous address, stack capture request). An agent that
missed an answer loses nothing: the next answer carries the full plan again. The report
itself is the heartbeat; a connection that closes (the agent process died: the kernel
closes its sockets) is noticed at once, a silent one after ``heartbeat_timeout_s``.

Messages are bounded (MAX_MESSAGE) so that a confused peer cannot exhaust memory.
"""

from __future__ import annotations

import json
import socket
from typing import Any

MAX_MESSAGE = 4 << 20


class ChannelClosed(ConnectionError):
    """The peer closed the connection or sent something that is not a message."""


class Channel:
    """One JSON-lines connection (blocking, with a timeout on every call)."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.sock.settimeout(timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    @classmethod
    def connect(cls, host: str, port: int, timeout_s: float) -> Channel:
        return cls(socket.create_connection((host, port), timeout=timeout_s), timeout_s)

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()
        self.sock.sendall(data)

    def recv(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ChannelClosed("peer closed the connection")
            self._buf += chunk
            if len(self._buf) > MAX_MESSAGE:
                raise ChannelClosed(f"message over {MAX_MESSAGE} bytes")
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ChannelClosed(f"not a JSON message: {exc}") from exc
        if not isinstance(obj, dict):
            raise ChannelClosed("message is not a JSON object")
        return obj

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        return self.recv()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def host_address() -> str:
    """This host's address as other nodes reach it (its hostname's, else loopback)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
