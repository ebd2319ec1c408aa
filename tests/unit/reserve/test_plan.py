"""The pure reserve planner: reconcile and handoff decisions from snapshots."""

from __future__ import annotations

from slurm_robust.reserve.config import ReserveConfig
from slurm_robust.reserve.ledger import JobLedger
from slurm_robust.reserve.plan import (
    DeepCheck,
    Drain,
    Move,
    NodeView,
    Note,
    Snapshot,
    borrowable,
    plan_handoff,
    plan_reconcile,
)
from slurm_robust.reserve.verdicts import Verdict

NOW = 1_700_000_000.0
H = 3600.0
CFG = ReserveConfig()


def view(name: str, age_h: float | None = 1.0, idle: bool = True, drained: bool = False,
         usable: bool = True, reason: str = "") -> NodeView:
    return NodeView(name, idle, drained, usable and not drained, reason,
                    None if age_h is None else NOW - age_h * H)


def snap(train: list[NodeView], standby: list[NodeView]) -> Snapshot:
    return Snapshot(NOW, {v.name: v for v in train + standby},
                    {"train": tuple(v.name for v in train),
                     "standby": tuple(v.name for v in standby)})


def moves(actions: list) -> list[tuple[str, tuple[str, ...], str]]:
    return [(a.node, a.src, a.dst) for a in actions if isinstance(a, Move)]


def test_at_target_with_fresh_spares_does_nothing() -> None:
    s = snap([view("n1"), view("n2")], [view("s1"), view("s2")])
    assert plan_reconcile(s, CFG, 2) == []


def test_fill_takes_fresh_idle_train_nodes_newest_pass_first() -> None:
    s = snap([view("n1", 5), view("n2", 1), view("n3", 2, idle=False)], [view("s1")])
    assert moves(plan_reconcile(s, CFG, 2)) == [("n2", ("train",), "standby")]


def test_drained_busy_and_down_nodes_never_enter() -> None:
    s = snap([view("n1", drained=True, reason="x"), view("n2", idle=False),
              view("n3", usable=False)], [])
    assert plan_reconcile(s, CFG, 1) == []


def test_stale_candidate_is_checked_before_it_can_enter() -> None:
    s = snap([view("n1", age_h=30), view("n2", age_h=None)], [])
    actions = plan_reconcile(s, CFG, 1)
    assert actions == [DeepCheck("n1", "candidate for the reserve")]
    # After the check the caller re-snapshots; a pass makes n1 fresh and it moves.
    s2 = snap([view("n1", age_h=0.01), view("n2", age_h=None)], [])
    assert moves(plan_reconcile(s2, CFG, 1, frozenset({"n1"}))) == [("n1", ("train",),
                                                                      "standby")]


def test_stale_member_is_checked_then_returned_if_still_stale() -> None:
    s = snap([view("n1")], [view("s1", age_h=48)])
    # n1 is fresh, so only the stale member needs a check.
    assert plan_reconcile(s, CFG, 1) == [DeepCheck("s1", "reserve member's deep pass is stale")]
    # Checked and failed (still stale): it goes home and a fresh train node replaces it.
    got = moves(plan_reconcile(s, CFG, 1, frozenset({"s1"})))
    assert ("s1", ("standby",), "train") in got and ("n1", ("train",), "standby") in got


def test_surplus_returns_the_oldest_passes_home() -> None:
    s = snap([], [view("s1", 1), view("s2", 10), view("s3", 3)])
    assert moves(plan_reconcile(s, CFG, 1)) == [("s3", ("standby",), "train"),
                                               ("s2", ("standby",), "train")]


def test_drained_member_goes_home_and_busy_member_stays() -> None:
    s = snap([], [view("s1", drained=True, reason="slurm_robust: x"), view("s2", idle=False)])
    assert moves(plan_reconcile(s, CFG, 0)) == [("s1", ("standby",), "train")]


def test_plan_is_idempotent_after_applying_it() -> None:
    s = snap([view("n1"), view("n2"), view("n3")], [])
    first = plan_reconcile(s, CFG, 2)
    assert len(moves(first)) == 2
    applied = snap([view("n3")], [view("n1"), view("n2")])
    assert plan_reconcile(applied, CFG, 2) == []


def verdict(node: str, job: str = "7", reason: str = "gpu_xid: Xid 79") -> Verdict:
    return Verdict(job, node, reason, "gpu_memory_error", "inc-1", {})


def test_handoff_drains_blamed_node_and_moves_one_spare_per_lost_node() -> None:
    s = snap([view("n1"), view("n2")], [view("s1", 2), view("s2", 1)])
    plan = plan_handoff("7", "train", True, [verdict("n2")], s, CFG, {})
    # Blame from a job is a suspicion: pending a deep check, class and evidence, and a
    # DOWN node is drained too (ReturnToService must not bring it back unchecked).
    assert plan.actions[0] == Drain(
        "n2", "slurm_robust: pending deep check: gpu_memory_error: gpu_xid: Xid 79",
        "verdict of job 7", "7", down_too=True)
    assert moves(plan.actions) == [("s2", ("standby",), "train")]  # freshest spare first
    assert plan.shortfall == 0


def test_handoff_without_requeue_only_drains() -> None:
    s = snap([view("n1")], [view("s1")])
    plan = plan_handoff("7", "train", False, [verdict("n1")], s, CFG, {})
    assert moves(plan.actions) == [] and isinstance(plan.actions[0], Drain)


def test_handoff_keeps_admin_reason_but_still_replaces_the_node() -> None:
    s = snap([view("n1", drained=True, reason="memory test by alice")], [view("s1")])
    plan = plan_handoff("7", "train", True, [verdict("n1")], s, CFG, {})
    assert isinstance(plan.actions[0], Note) and "alice" in plan.actions[0].why
    assert moves(plan.actions) == [("s1", ("standby",), "train")]


def test_handoff_reports_shortfall_and_skips_stale_spares() -> None:
    s = snap([view("n1"), view("n2")], [view("s1", age_h=40)])
    plan = plan_handoff("7", "train", True, [verdict("n1"), verdict("n2")], s, CFG, {})
    assert moves(plan.actions) == [] and plan.shortfall == 2


def test_handoff_uses_repeat_offender_reason() -> None:
    s = snap([view("n1")], [view("s1")])
    plan = plan_handoff("7", "train", True, [verdict("n1")], s, CFG,
                        {"n1": "slurm_robust: repeat offender: ..."})
    assert plan.actions[0].reason == "slurm_robust: repeat offender: ..."


def test_handoff_to_a_non_train_partition_moves_nothing() -> None:
    s = snap([view("n1")], [view("s1")])
    plan = plan_handoff("7", "debug", True, [verdict("n1")], s, CFG, {})
    assert moves(plan.actions) == []


def test_handoff_blame_cap_refuses_drains_and_spares_over_the_cap() -> None:
    cfg = ReserveConfig(job_blame_cap=2)
    s = snap([view("n1"), view("n2"), view("n3")], [view("s1"), view("s2"), view("s3")])
    plan = plan_handoff("7", "train", True, [verdict("n1"), verdict("n2"), verdict("n3")],
                        s, cfg, {})
    assert [a.node for a in plan.actions if isinstance(a, Drain)] == ["n1", "n2"]
    refused = [a for a in plan.actions if isinstance(a, Note)]
    assert refused[0].node == "n3" and "job_blame_cap=2" in refused[0].why
    assert len(moves(plan.actions)) == 2 and plan.lost == ["n1", "n2"]


def test_handoff_ledger_counts_over_the_jobs_life() -> None:
    """Across requeues: a job charged 2 drains and 2 spares before gets nothing more,
    but a node it blamed before may be named again (no new room needed, no new spare)."""
    cfg = ReserveConfig(job_blame_cap=2)
    ledger = JobLedger("7", ["n1", "n2"], ["s0", "s9"])
    s = snap([view("n1"), view("n3")], [view("s1")])
    plan = plan_handoff("7", "train", True, [verdict("n1"), verdict("n3")], s, cfg, {},
                        ledger)
    assert [a.node for a in plan.actions if isinstance(a, Drain)] == ["n1"]
    assert moves(plan.actions) == [] and plan.shortfall == 0


def test_handoff_never_hands_more_spares_than_lost() -> None:
    ledger = JobLedger("7", ["n1"], ["s0"])
    s = snap([view("n2")], [view("s1"), view("s2")])
    plan = plan_handoff("7", "train", True, [verdict("n2")], s, CFG, {}, ledger, cap=4)
    assert moves(plan.actions) == [("s1", ("standby",), "train")]
    broken = JobLedger("7", broken=True)  # an unreadable ledger: fail closed
    plan = plan_handoff("7", "train", True, [verdict("n2")], s, CFG, {}, broken, cap=4)
    assert moves(plan.actions) == [] and not any(isinstance(a, Drain) for a in plan.actions)


def test_reconcile_never_borrows_train_below_what_a_queued_job_needs() -> None:
    """after a handoff, reconcile refilled the reserve from idle train
    nodes until the train partition could no longer run the queued job."""
    s = snap([view("n1"), view("n2"), view("n3"), view("n4", drained=True)], [])
    assert borrowable(s, CFG, 3) == 0
    assert moves(plan_reconcile(s, CFG, 2, keep=3)) == []
    assert len(moves(plan_reconcile(s, CFG, 2, keep=2))) == 1
    assert len(moves(plan_reconcile(s, CFG, 2))) == 2  # nothing queued: fill to target
