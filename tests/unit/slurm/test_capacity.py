"""Refusing allocations a partition can never satisfy (nodes + spares vs its limits)."""

from __future__ import annotations

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.slurm.capacity import PartitionLimits, check_fits, parse_limits, pick_partition

# As `scontrol show partition -o` prints them on the mini-cluster (Slurm 22.05).
SHOW = (
    "PartitionName=train AllowGroups=ALL AllowAccounts=ALL Default=YES MaxNodes=UNLIMITED "
    "MaxTime=UNLIMITED MinNodes=0 Nodes=node[1-4] State=UP TotalCPUs=8 TotalNodes=4\n"
    "PartitionName=standby AllowGroups=ALL Default=NO MaxNodes=1 Nodes=spare[1-2] "
    "State=UP TotalCPUs=4 TotalNodes=2\n"
)


def test_parse_and_pick_default_and_named():
    train = pick_partition(SHOW, None)
    assert train == PartitionLimits("train", 4, None) and train.most == 4
    standby = pick_partition(SHOW, "standby")
    assert standby == PartitionLimits("standby", 2, 1) and standby.most == 1


def test_four_plus_one_on_four_nodes_is_refused_with_what_to_do():
    with pytest.raises(UsageError) as err:
        check_fits(pick_partition(SHOW, None), nodes=4, spares=1)
    msg = str(err.value)
    assert "\n" not in msg
    assert "5 nodes" in msg and "'train' has 4 nodes" in msg and "at most 3 nodes" in msg
    check_fits(pick_partition(SHOW, None), nodes=3, spares=1)  # fits exactly: no error


def test_max_nodes_limits_below_the_node_count():
    with pytest.raises(UsageError, match="MaxNodes"):
        check_fits(pick_partition(SHOW, "standby"), nodes=1, spares=1)
    check_fits(pick_partition(SHOW, "standby"), nodes=1, spares=0)


def test_unknown_partition_and_no_default_are_clear():
    with pytest.raises(UsageError, match=r"'gpu' does not exist \(known: train, standby\)"):
        pick_partition(SHOW, "gpu")
    with pytest.raises(UsageError, match="no default partition"):
        pick_partition(SHOW.splitlines()[1], None)
    with pytest.raises(UsageError, match="no node count"):
        parse_limits("PartitionName=x Default=YES")
