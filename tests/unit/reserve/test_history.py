"""Failure history from Slurm node events, distinct failures, repeat offenders."""

from __future__ import annotations

import time

from slurm_robust.reserve.history import (
    NodeEvent,
    events_from_health,
    events_from_sacctmgr,
    failure_times,
    repeat_offender_reason,
)

H = 3600.0


def t(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


RAW = """robust||2026-11-29T08:15:25|Unknown||Cluster Registered TRES|
robust|node3|2026-11-29T08:15:38|2026-11-29T08:20:00|DRAIN|slurm_robust: gpu_xid: Xid 79|root(0)
robust|node3|2026-11-29T09:00:00|Unknown|DRAIN|slurm_robust: nccl|root(0)
robust|node2|2026-11-29T08:00:00|2026-11-29T08:30:00|DRAIN|maintenance by bob|root(0)
robust|node1|2026-11-29T07:00:00|2026-11-29T07:05:00|DOWN*|Not responding|slurm(64030)
"""


def test_sacctmgr_events_keep_fault_periods_only() -> None:
    events = events_from_sacctmgr(RAW)
    kinds = [(e.node, e.kind) for e in events]
    assert ("node2", "failed") not in kinds  # an admin's maintenance is not a failure
    assert kinds.count(("node3", "failed")) == 2 and kinds.count(("node3", "returned")) == 1
    assert ("node1", "failed") in kinds and ("node1", "returned") in kinds
    back = [e for e in events if e.node == "node3" and e.kind == "returned"][0]
    assert back.time == t("2026-11-29T08:20:00")


def test_failures_of_one_node_within_a_window_count_once() -> None:
    events = [NodeEvent("a", 0.0, "failed"), NodeEvent("a", 1 * H, "failed"),
              NodeEvent("a", 30 * H, "failed"), NodeEvent("b", 1 * H, "failed"),
              NodeEvent("a", 2 * H, "returned")]
    assert failure_times(events, 24 * H) == [0.0, 1 * H, 30 * H]


def test_health_records_give_one_failure_per_failing_run() -> None:
    recs = [{"node": "n1", "run_id": "r1", "status": "fail", "time": 5.0, "reason": "x"},
            {"node": "n1", "run_id": "r1", "status": "fail", "time": 5.0, "reason": "y"},
            {"node": "n1", "run_id": "r2", "status": "ok", "time": 9.0}]
    assert [(e.node, e.time) for e in events_from_health(recs)] == [("n1", 5.0)]


def test_repeat_offender_fails_again_soon_after_return() -> None:
    history = events_from_sacctmgr(RAW)
    now = t("2026-11-29T10:20:00")  # two hours after node3's return
    reason = repeat_offender_reason("node3", history, now, 72 * H, "gpu_xid: Xid 48")
    assert reason is not None
    # Flat: the new fault and how soon; the earlier reason is never nested.
    assert reason == "slurm_robust: repeat offender: gpu_xid: Xid 48; again 2.0 h after return"


def test_repeat_reasons_do_not_nest() -> None:
    history = [NodeEvent("n", 0.0, "failed", "slurm_robust: repeat offender: nccl; failed "
                                             "again 1.0 h after return (before: xid)"),
               NodeEvent("n", 10.0, "returned")]
    reason = repeat_offender_reason("n", history, 20.0, 72 * H, "slurm_robust: ecc")
    assert reason == "slurm_robust: repeat offender: ecc: again 0.0 h after return"
    # Fed its own earlier reason, it still comes out flat.
    again = repeat_offender_reason("n", history, 20.0, 72 * H, reason)
    assert again == reason and again.count("repeat offender") == 1


def test_not_a_repeat_offender_outside_the_window_or_never_returned() -> None:
    history = events_from_sacctmgr(RAW)
    late = t("2026-12-09T08:20:00")
    assert repeat_offender_reason("node3", history, late, 72 * H) is None
    assert repeat_offender_reason("node4", history, late, 72 * H) is None
    # Returned without a preceding failure: not an offender.
    only_return = [NodeEvent("x", 10.0, "returned")]
    assert repeat_offender_reason("x", only_return, 20.0, 72 * H) is None
