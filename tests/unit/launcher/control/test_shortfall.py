"""A requeue the partition and reserve cannot serve: the policy, pure and
through the recovery owner (Slurm side injected: the count and the requeue recorded)."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.shortfall import (
    Capacity,
    Choice,
    ShortfallPolicy,
    plan_requeue,
)
from slurm_robust.launcher.enums import Phase
from slurm_robust.launcher.submit.status import format_status, run_status

from .test_recovery_owner import Harness


def cap(has: int, needs: int = 4) -> Capacity:
    return Capacity("train", needs, has, 0)


@pytest.mark.parametrize(("capacity", "policy", "choice", "nodes"), [
    (None, ShortfallPolicy.STOP, Choice.REQUEUE, None),       # Slurm could not tell
    (cap(4), ShortfallPolicy.STOP, Choice.REQUEUE, None),     # enough
    (cap(3), ShortfallPolicy.SHRINK, Choice.SHRINK, 3),       # a spare fewer, world fits
    (cap(2), ShortfallPolicy.SHRINK, Choice.STOP, None),      # the world does not fit
    (cap(3), ShortfallPolicy.STOP, Choice.STOP, None),
    (cap(0), ShortfallPolicy.WAIT, Choice.REQUEUE, None),
])
def test_plan_requeue(capacity, policy, choice, nodes):
    plan = plan_requeue(capacity, policy, min_nodes=3)
    assert (plan.choice, plan.nodes) == (choice, nodes)
    if capacity is not None and capacity.short:
        assert "reserve shortfall (needs 4, has" in plan.reason


def test_unknown_policy_is_refused(tmp_path):
    with pytest.raises(UsageError, match="on_shortfall"):
        RunConfig(command=("x",), run_dir=str(tmp_path), on_shortfall="maybe")


class Counted(Harness):
    """The harness with a recorded capacity count and a requeue that takes num_nodes."""

    def __init__(self, tmp_path: Any, has: int, **kw: Any) -> None:
        super().__init__(tmp_path, **kw)
        needs = self.cfg.total_nodes

        def requeue(job_id: str, exclude: Any, num_nodes: int | None = None) -> None:
            self.slurm.calls.append(("requeue", job_id, sorted(exclude), num_nodes))

        self.rec.slurm.requeue = requeue
        self.rec.slurm.capacity = lambda job_id, exclude: Capacity("train", needs, has, 0)


def node_fault_to_requeue(h: Counted) -> None:
    h.start()
    h.fail(h.members[0], "gpu_unavailable")  # the controller's node: a requeue
    h.settle()


def test_shrink_requeues_with_fewer_spares(tmp_path):
    h = Counted(tmp_path, has=2, nodes=2, spares=1)
    node_fault_to_requeue(h)
    assert ("requeue", "42", ["n1"], 2) in h.slurm.calls
    assert h.rec.phase is Phase.REQUEUED
    short = h.rec.state.open_incident.to_json()["evidence"]["shortfall"]
    assert (short["needs"], short["has"], short["choice"]) == (3, 2, "shrink")


def test_stop_ends_the_run_with_a_verdict_instead_of_pending(tmp_path):
    h = Counted(tmp_path, has=1, nodes=2, spares=1)
    node_fault_to_requeue(h)
    assert not [c for c in h.slurm.calls if c[0] == "requeue"]
    assert h.rec.phase is Phase.DONE and h.rec.result.status == "stopped"
    assert "reserve shortfall (needs 3, has 1)" in h.rec.result.verdict
    inc = h.incidents()[-1]
    assert inc["rung"] == "stop" and inc["evidence"]["shortfall"]["choice"] == "stop"
    assert h.rec.state.requeues == 0


def test_wait_requeues_and_status_says_pending(tmp_path):
    h = Counted(tmp_path, has=1, nodes=2, spares=1, on_shortfall="wait")
    node_fault_to_requeue(h)
    assert ("requeue", "42", ["n1"], None) in h.slurm.calls
    status = run_status(h.cfg.run_dir)
    assert status["pending"].startswith("pending: reserve shortfall (needs 3, has 1)")
    assert "pending: reserve shortfall (needs 3, has 1)" in format_status(status)


def test_enough_nodes_requeues_as_asked(tmp_path):
    h = Counted(tmp_path, has=3, nodes=2, spares=1)
    node_fault_to_requeue(h)
    assert ("requeue", "42", ["n1"], None) in h.slurm.calls
    assert "shortfall" not in h.rec.state.open_incident.to_json()["evidence"]
    assert run_status(h.cfg.run_dir)["pending"] is None


# ------------------------------------------------ the controller's node lost (agent path)
def controller_lost(tmp_path, monkeypatch, has: int, **cfg_kw: Any) -> tuple[Any, list]:
    from slurm_robust.launcher.control import requeue as rq
    from slurm_robust.launcher.identity import Identity
    from slurm_robust.launcher.paths import RunPaths

    cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"), **cfg_kw)
    RunPaths.of(cfg.run_dir).root.mkdir(parents=True, exist_ok=True)
    calls: list = []
    monkeypatch.setattr(rq, "requeue_job", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(rq, "write_verdict", lambda *a, **k: None)
    monkeypatch.setattr(rq, "job_capacity", lambda job, exclude, reserve:
                        Capacity("train", cfg.total_nodes, has, 0))
    me = Identity(index=1, node="n2", job_id="7", step_key="7.0.0", restart_count=0)
    assert rq.requeue_after_controller_loss(cfg, me, "n1", "timed out", 1.0) is True
    return cfg, calls


def test_controller_loss_shrinks_the_requeue(tmp_path, monkeypatch):
    _, calls = controller_lost(tmp_path, monkeypatch, has=2, nodes=2, spares=1)
    assert calls == [(("7", ["n1"], 0), {"num_nodes": 2, "site_config": None})]


def test_controller_loss_into_a_shortfall_stops_the_run(tmp_path, monkeypatch):
    from slurm_robust.launcher.control.state import load_state
    from slurm_robust.launcher.paths import RunPaths
    from slurm_robust.records import read_records

    cfg, calls = controller_lost(tmp_path, monkeypatch, has=1, nodes=2, spares=0)
    assert calls == []
    paths = RunPaths.of(cfg.run_dir)
    state = load_state(paths.state)
    assert state.finished == "stopped" and state.requeues == 0
    assert "reserve shortfall (needs 2, has 1)" in state.verdict
    events = read_records(paths.events).records
    assert [e["event"] for e in events] == ["incident", "run_end"]
    assert events[0]["rung"] == "stop" and events[1]["status"] == "stopped"
    status = run_status(cfg.run_dir)
    assert status["pending"] is None and status["status"] == "stopped"
    assert "verdict: reserve shortfall (needs 2, has 1)" in format_status(status)


def test_job_capacity_counts_one_sinfo_with_the_jobs_own_environment():
    from slurm_robust.launcher.control.shortfall import job_capacity
    from slurm_robust.slurm import Node

    def node(name: str, part: str, state: str = "idle", flags: tuple = ()) -> Node:
        return Node(name, state, frozenset(flags), "", "", 0, (part,), 4, 0)

    class OneSinfo:
        calls = 0

        def nodes(self) -> list[Node]:
            self.calls += 1
            return [node("n1", "train", "allocated"), node("n2", "train", "allocated"),
                    node("n3", "train", "down"), node("n4", "train", "allocated"),
                    node("s1", "standby"), node("s2", "standby", flags=("DRAIN",))]

    slurm = OneSinfo()
    env = {"SLURM_JOB_PARTITION": "train", "SLURM_JOB_NUM_NODES": "4"}
    got = job_capacity("7", ["n1"], "standby", slurm, env)  # type: ignore[arg-type]
    # n2 and n4 usable off the exclusion (n3 is down), one idle spare for one lost node.
    assert got == Capacity("train", 4, 3, 1) and got.short and slurm.calls == 1
