"""``reserve reset`` restores the configured partition layout."""

from __future__ import annotations

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.reserve.layout import configured_partitions, plan_reset
from slurm_robust.reserve.plan import Snapshot

CONF = """
NodeName=node[1-4] CPUs=2
PartitionName=train Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP
partitionname=standby nodes=spare[1-2] State=UP  # the warm reserve
PartitionName=debug Nodes=node1
"""


def test_configured_partitions_are_read_from_slurm_conf() -> None:
    got = configured_partitions(CONF, ["train", "standby"])
    assert got == {"train": ["node1", "node2", "node3", "node4"],
                   "standby": ["spare1", "spare2"]}
    with pytest.raises(UsageError, match="nope"):
        configured_partitions(CONF, ["nope"])


def test_reset_moves_drifted_nodes_home_and_nothing_else() -> None:
    # After a handoff (spare1 into train) and a reconcile (node4 into standby):
    snap = Snapshot(0.0, {}, {"train": ("node1", "node2", "node3", "spare1"),
                              "standby": ("spare2", "node4")})
    moves = plan_reset(snap, configured_partitions(CONF, ["train", "standby"]))
    assert [(m.node, m.src, m.dst) for m in moves] == [
        ("node4", ("standby",), "train"), ("spare1", ("train",), "standby")]
    home = Snapshot(0.0, {}, {"train": ("node1", "node2", "node3", "node4"),
                              "standby": ("spare1", "spare2")})
    assert plan_reset(home, configured_partitions(CONF, ["train", "standby"])) == []
