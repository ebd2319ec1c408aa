"""Connections to the controller that have not passed the handshake yet.

Any user who can reach the controller's port can open connections; until the peer has
proved it holds the run secret, each one costs a thread and a descriptor. Bounds:

- every handshake has one total deadline (``auth.HANDSHAKE_S``, ``Channel.bounded``);
- at most ``per_peer`` unauthenticated connections per source address, and at most
  ``total`` in all. At a bound the *oldest* unauthenticated connection (of that address,
  else of any) is shut down to make room, rather than the new one refused: a stranger on
  the same node as an agent shares the agent's address, and refusing newcomers would let
  it hold the address's slots by reconnecting as each deadline expires. A genuine
  handshake takes one round trip, so it is done long before it could be the oldest.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import OrderedDict

log = logging.getLogger("slurm_robust.launcher.control.admission")

#: Unauthenticated connections one source address may have open (agents on one host,
#: as in a mini-cluster, reconnect together after a failover).
PREAUTH_PER_PEER = 8


class PreauthGate:
    """The unauthenticated connections, oldest first (see the module docstring)."""

    def __init__(self, per_peer: int = PREAUTH_PER_PEER) -> None:
        self.per_peer = per_peer
        self._lock = threading.Lock()
        self._open: OrderedDict[socket.socket, str] = OrderedDict()

    def enter(self, peer: str, sock: socket.socket, total: int) -> None:
        """Count ``sock`` from ``peer``, shutting down the oldest ones over a bound."""
        with self._lock:
            mine = [s for s, p in self._open.items() if p == peer]
            while len(mine) >= self.per_peer:
                self._evict(mine.pop(0), f"{len(mine) + 1} unauthenticated from {peer}")
            while self._open and len(self._open) >= max(1, total):
                self._evict(next(iter(self._open)), f"{len(self._open)} unauthenticated")
            self._open[sock] = peer

    def leave(self, sock: socket.socket) -> None:
        """``sock`` authenticated or closed (idempotent). Called before it is closed, so
        the gate never shuts down a descriptor number that was reused."""
        with self._lock:
            self._open.pop(sock, None)

    def count(self, peer: str | None = None) -> int:
        with self._lock:
            return sum(1 for p in self._open.values() if peer is None or p == peer)

    def _evict(self, sock: socket.socket, why: str) -> None:
        peer = self._open.pop(sock)
        log.warning("shut down the oldest unauthenticated controller connection from %s "
                    "(%s open)", peer, why)
        try:
            # Its handler's blocked recv returns at once; the handler closes it.
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone
