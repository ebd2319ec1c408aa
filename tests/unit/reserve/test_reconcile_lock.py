"""Reconcile releases the reserve lock while remote deep checks run: a job-end handoff
that arrives during a long check takes the lock at once (it waits at most
``lock_timeout_s``, 60 s by default, and would give up and leave the requeued job without
spares), and reconcile re-plans afterwards from what the handoff changed."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slurm_robust.reserve.gate import DeepRun
from slurm_robust.reserve.lock import reserve_lock
from slurm_robust.reserve.reconcile import reconcile
from tests.unit.reserve.test_respare import FakeSlurm, cfg_for, job, node

NOW = 1_000_000.0
HOUR = 3600.0


class SlurmWithQueue(FakeSlurm):
    def jobs(self):
        return []


class SlowRemoteGate:
    """A reserve member whose deep pass is stale; its remote deep check takes a while and
    passes. While it runs, the test plays a job-end handoff taking the lock."""

    def __init__(self, slurm: SlurmWithQueue, lock_path: Path) -> None:
        self.slurm = slurm
        self.lock_path = lock_path
        self.passes = {"spare1": NOW - 100 * HOUR, "spare2": NOW - 60.0,
                       "node1": NOW - 120.0, "node2": NOW - 60.0}
        self.handoff_waited: float | None = None

    def last_deep_pass(self, name: str) -> float | None:
        return self.passes.get(name)

    def journal(self, name: str) -> list:
        return []

    def run_deep(self, name: str) -> DeepRun:
        assert self.handoff_waited is None, f"a second deep check: {name}"

        def handoff() -> None:
            t0 = time.monotonic()
            with reserve_lock(self.lock_path, 5.0):
                self.handoff_waited = time.monotonic() - t0
                # The handoff hands spare2 to a requeued job in train.
                self.slurm.parts["standby"].remove("spare2")
                self.slurm.parts["train"].append("spare2")
        t = threading.Thread(target=handoff)
        t.start()
        t.join(10.0)
        self.passes[name] = NOW
        return DeepRun(name, True, True, "")


def test_a_handoff_during_a_remote_deep_check_gets_the_lock_at_once(tmp_path: Path) -> None:
    slurm = SlurmWithQueue([node(n) for n in ("node1", "node2", "spare1", "spare2")],
                           {"train": ["node1", "node2"], "standby": ["spare1", "spare2"]},
                           job())
    cfg = cfg_for(tmp_path, target=2)
    gate = SlowRemoteGate(slurm, cfg.lock_file)
    report = reconcile(slurm, gate, cfg, clock=lambda: NOW)  # type: ignore[arg-type]
    assert gate.handoff_waited is not None and gate.handoff_waited < 1.0
    checks = [o for o in report.outcomes if o["action"] == "deep_check"]
    assert [(o["node"], o["passed"]) for o in checks] == [("spare1", True)]
    # Re-planned after the check, from the handoff's change: spare1 passed and stays,
    # and the reserve is refilled to its target from train's idle nodes.
    assert "spare1" in slurm.parts["standby"] and len(slurm.parts["standby"]) == 2
    assert report.spares_before == ["spare2"]
