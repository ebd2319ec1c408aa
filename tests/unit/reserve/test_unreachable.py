"""A requeued job's drained node whose slurmd is gone is set DOWN, and no other node is."""

from __future__ import annotations

import json
import socket

from slurm_robust.reserve.unreachable import down_unreachable, slurmd_answers
from slurm_robust.slurm import Node, SlurmCommandError
from slurm_robust.slurm.records import parse_sinfo_json

OURS = "slurm_robust: pending deep check: node_lost: controller heartbeat lost"


def node(name: str, reason: str = OURS, drained: bool = True, state: str = "allocated",
         port: int = 17000) -> Node:
    return Node(name, state, frozenset({"DRAIN"} if drained else ()), reason, "slurm", 0,
                ("train",), 2, 2, address=f"10.0.0.{name[-1]}", port=port)


class FakeSlurm:
    def __init__(self, nodes: list[Node], refuse: bool = False) -> None:
        self.by_name = {n.name: n for n in nodes}
        self.refuse = refuse
        self.updates: list[tuple[str, str, str | None]] = []

    def nodes(self, names=None):
        return [self.by_name[n] for n in (names or self.by_name) if n in self.by_name]

    def update_node(self, name: str, state: str, reason: str | None = None) -> None:
        if self.refuse:
            raise SlurmCommandError(["scontrol"], 1, "Invalid user for SlurmUserId")
        self.updates.append((name, state, reason))


def test_only_our_drained_nodes_with_a_silent_slurmd_go_down() -> None:
    dead = {"10.0.0.1", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"}
    asked: list[tuple[str, int]] = []

    def probe(address: str, port: int, timeout_s: float) -> bool:
        asked.append((address, port))
        return address not in dead

    slurm = FakeSlurm([
        node("node1"),                                   # ours, slurmd gone: DOWN
        node("node2"),                                   # ours, slurmd answers: kept
        node("node3", reason="maintenance by alice"),    # an admin's drain: kept
        node("node4", drained=False, reason=""),         # not drained: kept
        node("node5", state="down"),                     # DOWN already
        node("node6", port=0),                           # no address known: not probed
    ])
    outcomes = down_unreachable(slurm, ["node6", "node5", "node4", "node3", "node2", "node1",
                                        "node1"], probe)
    assert [(o.node, o.ok) for o in outcomes] == [("node1", True)]
    assert "10.0.0.1:17000 does not answer" in outcomes[0].why
    # The drain reason is kept: the node comes back only through the deep check.
    assert slurm.updates == [("node1", "down", OURS)]
    assert sorted(asked) == [("10.0.0.1", 17000), ("10.0.0.2", 17000)]


def test_a_refused_update_is_reported_not_raised() -> None:
    slurm = FakeSlurm([node("node1")], refuse=True)
    outcomes = down_unreachable(slurm, ["node1"], lambda a, p, t: False)
    assert [(o.node, o.ok) for o in outcomes] == [("node1", False)]
    assert "Invalid user" in outcomes[0].error


def test_no_names_no_slurm_call() -> None:
    class NoSlurm:
        def nodes(self, names=None):
            raise AssertionError("no node named: no Slurm call")

    assert down_unreachable(NoSlurm(), [], lambda a, p, t: False) == []


def test_the_real_probe_tells_a_listener_from_a_closed_port() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        assert slurmd_answers("127.0.0.1", port, 2.0)
    # The same port, nobody listening any more: refused at once.
    assert not slurmd_answers("127.0.0.1", port, 2.0)


def test_sinfo_json_carries_the_slurmd_address_and_port() -> None:
    text = json.dumps({"nodes": [{"name": "node2", "state": "down", "state_flags": ["DRAIN"],
                                  "reason": OURS, "address": "10.213.0.12", "port": 17002,
                                  "partitions": ["train"], "cpus": 2, "alloc_cpus": 0}]})
    (n,) = parse_sinfo_json(text)
    assert (n.address, n.port, n.drained, n.state) == ("10.213.0.12", 17002, True, "down")
