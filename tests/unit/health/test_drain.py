"""Drain decisions (never over an admin's reason; ours start with ``slurm_robust:``) and
Xid parsing of recorded kernel-log lines."""

from __future__ import annotations

from slurm_robust.health import decide_drain
from slurm_robust.health.nvml import normalise_bus_id, parse_kmsg_xids
from slurm_robust.slurm import Node

REASON = "slurm_robust: gpu_xid: Xid 79 on GPU 3, expected no critical Xid"


def node(state: str = "allocated", flags: tuple[str, ...] = (), reason: str = "",
         user: str = "") -> Node:
    return Node("node2", state, frozenset(flags), reason, user, 0, ("train",), 2, 2)


def test_healthy_node_is_drained_with_our_reason() -> None:
    d = decide_drain(node(), REASON)
    assert (d.action, d.reason) == ("drain", REASON)


def test_admin_reason_is_never_overwritten() -> None:
    d = decide_drain(node(flags=("DRAIN",), reason="bad DIMM, ticket 4711", user="alice"),
                     REASON)
    assert d.action == "keep"
    assert "bad DIMM" in d.why


def test_our_own_and_slurms_generic_reasons_are_refreshed() -> None:
    assert decide_drain(node(flags=("DRAIN",), reason="slurm_robust: old"), REASON).action \
        == "drain"
    assert decide_drain(node(flags=("DRAIN",), reason="Prolog error"), REASON).action == "drain"


def test_down_or_missing_nodes_are_left_alone() -> None:
    assert decide_drain(node(state="down"), REASON).action == "keep"
    assert decide_drain(None, REASON).action == "keep"


def test_reason_gets_the_prefix() -> None:
    assert decide_drain(node(), "gpu_ecc: x").reason == "slurm_robust: gpu_ecc: x"


def test_kmsg_xids_since_cursor() -> None:
    lines = [
        "6,100,1000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
        "4,101,2000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        "4,102,3000,-;NVRM: Xid (PCI:0000:86:00): 13, pid=99, Graphics Exception",
        "garbage without header",
    ]
    found, last = parse_kmsg_xids(lines, after_seq=-1)
    assert found == [("0000:3b:00", 79), ("0000:86:00", 13)]
    assert last == 102
    assert parse_kmsg_xids(lines, after_seq=101) == ([("0000:86:00", 13)], 102)


def test_bus_ids_from_nvml_and_kernel_match() -> None:
    assert normalise_bus_id("00000000:3B:00.0") == normalise_bus_id("0000:3b:00")
