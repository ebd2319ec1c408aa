"""The one drain-reason format: flat, short, the
check or class and its evidence, "pending deep check" for a job's suspicion."""

from __future__ import annotations

from slurm_robust.health import PENDING_PREFIX, ReasonKind, decide_drain, drain_reason
from slurm_robust.health.drain import REASON_LIMIT, reason_kind
from slurm_robust.slurm import Node


def node(state: str = "allocated", flags: tuple[str, ...] = (), reason: str = "") -> Node:
    return Node("node2", state, frozenset(flags), reason, "", 0, ("train",), 2, 2)


def test_pending_reason_matches_the_deep_check_contract() -> None:
    r = drain_reason("node_lost", "heartbeat lost 12s", ReasonKind.PENDING)
    assert r == "slurm_robust: pending deep check: node_lost: heartbeat lost 12s"
    assert r.startswith(PENDING_PREFIX) and reason_kind(r) is ReasonKind.PENDING


def test_check_reason_keeps_its_evidence_and_is_idempotent() -> None:
    r = drain_reason("slurm_robust: gpu_xid: Xid 79 on GPU 3")
    assert r == "slurm_robust: gpu_xid: Xid 79 on GPU 3"
    assert drain_reason(r) == r and reason_kind(r) is ReasonKind.CHECK
    assert drain_reason(drain_reason("x", "y", ReasonKind.PENDING), "",
                        ReasonKind.PENDING) == "slurm_robust: pending deep check: x: y"


def test_never_nested_never_long_never_multiline() -> None:
    old = ("slurm_robust: repeat offender: nccl; failed again 1.0 h after return "
           "(before: slurm_robust: repeat offender: xid)")
    r = drain_reason(old, "again 2.0 h after return", ReasonKind.REPEAT)
    assert r == "slurm_robust: repeat offender: nccl: again 2.0 h after return"
    assert r.count("slurm_robust:") == 1
    long = drain_reason("gpu_memory_error", "x" * 500 + "\nState=RESUME", ReasonKind.PENDING)
    assert len(long) <= REASON_LIMIT and "\n" not in long
    assert long.startswith("slurm_robust: pending deep check: gpu_memory_error: xxx")
    assert reason_kind("maintenance by alice") is None


def test_decide_drain_formats_every_reason_and_keeps_its_kind() -> None:
    d = decide_drain(node(), "gpu_ecc: actual 4")
    assert d.reason == "slurm_robust: gpu_ecc: actual 4"
    pending = drain_reason("node_lost", "heartbeat lost 5s", ReasonKind.PENDING)
    assert decide_drain(node(), pending).reason == pending
    repeat = drain_reason("nccl_error: timeout", "again 0.0 h after return",
                          ReasonKind.REPEAT)
    assert repeat == "slurm_robust: repeat offender: nccl_error: timeout; again 0.0 h after return"
    assert decide_drain(node(), repeat).reason == repeat  # kept whole, never re-cut


def test_a_down_node_is_drained_only_when_asked_and_never_over_an_admin() -> None:
    pending = drain_reason("node_down", "Slurm marked it DOWN", ReasonKind.PENDING)
    assert decide_drain(node("down", reason="Not responding"), pending).action == "keep"
    assert decide_drain(node("down", reason="Not responding"), pending,
                        down_too=True).action == "drain"
    admin = node("down", reason="PSU swap, ticket 12")
    assert decide_drain(admin, pending, down_too=True).action == "keep"
