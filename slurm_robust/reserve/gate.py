"""The reserve's view of node health, through the health feature's public API.

:class:`HealthGate` is the injection point: the reserve asks when a node last passed the
deep suite, and asks for a deep run on a stale node. :class:`LocalSuiteGate` runs the deep
suite in this process under the node's name, which checks the right hardware only when
the node is this host: true on the mini-cluster (every node is localhost) and on a
controller that is itself a node. For any other node it refuses (the run reports
``ran=False``) instead of checking the controller's hardware and calling it the node's;
the reserve then does not count that node as a spare. On a real cluster the deep pass
comes from the node epilog (which runs the deep suite after every job) journaling into a
``state_dir`` the controller can read (a shared filesystem with ``{node}`` in the path).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from slurm_robust import health
from slurm_robust.site_config import SiteConfig

LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class DeepRun:
    """The result of asking for a deep suite on one node."""

    node: str
    ran: bool
    passed: bool
    reason: str


class HealthGate(Protocol):
    def last_deep_pass(self, node: str) -> float | None:
        """Unix time of the node's newest passing deep suite, or None."""

    def run_deep(self, node: str) -> DeepRun:
        """Run the deep suite on ``node`` (journaled with stage ``reserve``)."""

    def journal(self, node: str) -> list[dict[str, Any]]:
        """The node's health-journal records readable from here (empty if none)."""


class LocalSuiteGate:
    """Deep suite in this process; only for nodes whose address is this host.

    Args:
        site: the site config (health journal location, check parameters).
        address_of: node name -> NodeAddr/NodeHostname (e.g. ``Slurm.node_address``).
    """

    def __init__(self, site: SiteConfig, address_of: Callable[[str], str]) -> None:
        self.site = site
        self.address_of = address_of
        self._local = LOCAL_ADDRESSES | {socket.gethostname(), socket.getfqdn()}

    def last_deep_pass(self, node: str) -> float | None:
        return health.last_deep_pass(node, config=self.site)

    def journal(self, node: str) -> list[dict[str, Any]]:
        return health.read_journal(node, config=self.site)

    def run_deep(self, node: str) -> DeepRun:
        address = self.address_of(node)
        if address not in self._local:
            return DeepRun(node, False, False,
                           f"node address {address!r} is not this host; the deep suite "
                           "must run on the node (its epilog journals it)")
        result = health.run_suite("reserve", node=node, config=self.site)
        return DeepRun(node, True, result.admits, result.admission_reason)
