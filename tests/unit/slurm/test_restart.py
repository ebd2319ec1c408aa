"""When a requeued job's StartTime may be reset (slurm/restart.py).

The states are the ones squeue showed on the mini-cluster after ``scontrol requeue``
(COMPLETING, then PENDING); the clock is simulated so the credential margin is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from slurm_robust.slurm import Job
from slurm_robust.slurm.restart import CREDENTIAL_MARGIN_S, STARTED, start_requeued


def job(state: str) -> Job:
    return Job("7", "train", "alice", state, "", "train", (), 1, "", 1, True, 0, 0, 0, 0,
               "", "/")


@dataclass
class Cluster:
    """A job whose squeue state follows ``states`` (the last one stays), one per poll."""

    states: list[str]
    now: float = 1_000.25  # wall clock; the requeue is stamped at 1_000.25
    updates: list[tuple[float, dict[str, str]]] = field(default_factory=list)

    def job(self, job_id: str | int) -> Job | None:
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return None if state == "gone" else job(state)

    def update_job(self, job_id: str | int, **fields: str) -> None:
        self.updates.append((self.now, fields))

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def clock(self) -> float:
        return self.now

    def start(self, timeout_s: float = 60.0) -> str:
        return start_requeued(self, "7", 1_000.25, timeout_s, clock=self.clock,
                              wall=self.clock, sleep=self.sleep, poll_s=0.2)


def test_a_quick_epilog_waits_out_the_credentials_second():
    # Pending 0.4 s after the requeue: a launch now would carry a credential created in
    # the second the old one was revoked, and slurmd would refuse it for good.
    c = Cluster(["COMPLETING", "COMPLETING", "PENDING"])
    assert c.start() == STARTED
    [(at, fields)] = c.updates
    assert fields == {"StartTime": "now"}
    assert at >= 1_000 + CREDENTIAL_MARGIN_S


def test_a_slow_epilog_resets_as_soon_as_the_job_is_pending():
    c = Cluster(["COMPLETING"] * 20 + ["PENDING"])
    assert c.start() == STARTED
    [(at, _)] = c.updates
    assert at == pytest.approx(1_000.25 + 20 * 0.2)


@pytest.mark.parametrize("state", ["COMPLETING", "REQUEUED"])
def test_a_reset_before_the_job_is_back_in_the_queue_is_never_made(state):
    # Slurm sets the BeginTime hold when the job finishes completing: a reset before
    # would be undone.
    c = Cluster([state])
    assert c.start(timeout_s=5) == f"job still {state} after 5 s; StartTime not reset"
    assert c.updates == []


@pytest.mark.parametrize("state", ["RUNNING", "CONFIGURING", "FAILED", "CANCELLED", "gone"])
def test_a_job_already_back_or_ended_is_left_alone(state):
    c = Cluster(["COMPLETING", state])
    assert c.start().endswith("nothing to start")
    assert c.updates == []


def test_a_margin_beyond_the_budget_resets_nothing():
    c = Cluster(["PENDING"])
    assert c.start(timeout_s=0.5).startswith("credential margin ends after")
    assert c.updates == []
