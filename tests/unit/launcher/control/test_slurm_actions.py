"""Slurm actions off the control loop: transient retries within a budget, an applied
request whose answer was lost, and the controller-loss guard."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import requeue as rq
from slurm_robust.launcher.control.slurm_actions import (
    ActionState,
    SlurmAction,
    parse_ctld_timeout,
    retry_transient,
    transient,
)
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.slurm import SlurmCommandError


def err(text: str) -> SlurmCommandError:
    return SlurmCommandError(["scontrol", "requeue", "7"], 1, text)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


def test_transient_messages():
    assert transient(err("Unexpected message received for job 7"))
    assert transient(err("slurm_load_jobs error: Unable to contact slurm controller"))
    assert transient(SlurmCommandError(["x"], None, "", timed_out=True))
    assert not transient(err("Invalid job id specified"))


def test_ctld_timeout_is_read_from_the_config():
    text = "SlurmctldPort           = 6817\nSlurmctldTimeout        = 45 sec\n"
    assert parse_ctld_timeout(text) == 45.0
    assert parse_ctld_timeout("nothing") is None


def test_retries_until_slurmctld_is_back_within_the_budget():
    clock, calls = Clock(), []

    def call() -> str:
        calls.append(clock.t)
        if clock.t < 12:
            raise err("Unable to contact slurm controller (connect failure)")
        return "ok"

    assert retry_transient(call, "requeue", 120, sleep=clock.sleep, clock=clock) == "ok"
    assert len(calls) > 2 and calls == sorted(calls)
    assert all(b - a <= 10 for a, b in zip(calls, calls[1:], strict=False))


def test_gives_up_after_the_budget_and_at_once_on_a_refusal():
    clock = Clock()
    with pytest.raises(SlurmCommandError):
        retry_transient(lambda: (_ for _ in ()).throw(err("slurmctld is busy")), "x", 30,
                        sleep=clock.sleep, clock=clock)
    assert 15 <= clock.t <= 30
    clock2 = Clock()
    with pytest.raises(SlurmCommandError, match="Invalid"):
        retry_transient(lambda: (_ for _ in ()).throw(err("Invalid job id")), "x", 30,
                        sleep=clock2.sleep, clock=clock2)
    assert clock2.t == 0


class FakeSlurm:
    """A slurmctld whose answer to the requeue is lost although it applied it."""

    def __init__(self, restart_count: int, state: str) -> None:
        self.restart_count, self.state, self.requeues, self.updates = restart_count, state, 0, []

    def requeue(self, job_id: str, start_now: bool = True) -> None:
        self.requeues += 1
        self.restart_count += 1
        raise err(f"Unexpected message received for job {job_id}")

    def job(self, job_id: str) -> SimpleNamespace:
        return SimpleNamespace(restart_count=self.restart_count, state=self.state)

    def update_job(self, job_id: str, **fields: str) -> None:
        self.updates.append(fields)


def test_a_requeue_whose_answer_was_lost_is_not_repeated_nor_failed():
    slurm = FakeSlurm(restart_count=2, state="COMPLETING")
    rq.requeue_job("7", ["n2"], restart_count=2, slurm=slurm)  # type: ignore[arg-type]
    assert slurm.requeues == 1
    assert slurm.updates == [{"StartTime": "now", "ExcNodeList": "n2"}]


def test_an_action_runs_in_a_thread_and_reports_its_outcome():
    ok = SlurmAction("drain", lambda: None).start()
    ok.join(5)
    assert ok.outcome().state is ActionState.DONE
    bad = SlurmAction("requeue", lambda: (_ for _ in ()).throw(err("denied"))).start()
    bad.join(5)
    assert bad.outcome().state is ActionState.FAILED and "denied" in bad.outcome().error


def test_losing_a_controller_on_ones_own_node_blames_nothing(tmp_path, monkeypatch):
    cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"), nodes=2)
    RunPaths.of(cfg.run_dir).root.mkdir(parents=True, exist_ok=True)
    called = []
    monkeypatch.setattr(rq, "requeue_job", lambda *a, **k: called.append(a))
    me = Identity(index=0, node="n1", job_id="7", step_key="7.0.0", restart_count=0)
    assert rq.requeue_after_controller_loss(cfg, me, "n1", "timed out", 1.0) is False
    assert called == []
    assert not list(RunPaths.of(cfg.run_dir).root.glob("requeue-*.lock"))
