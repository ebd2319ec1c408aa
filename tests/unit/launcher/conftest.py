"""Shared fixtures of the launcher unit tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

import pytest

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.identity import Identity


@pytest.fixture
def start_controller(tmp_path, monkeypatch) -> Iterator[Callable[[float], Controller]]:
    """Start a real 2-node controller (no spares) with the given heartbeat timeout; it is
    ended at teardown."""
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    started: list[Controller] = []

    def start(heartbeat_timeout_s: float) -> Controller:
        cfg = RunConfig(command=(sys.executable, "-c", "pass"),
                        run_dir=str(tmp_path / "run"), nodes=2, spares=0,
                        startup_timeout_s=120.0, heartbeat_timeout_s=heartbeat_timeout_s)
        ident = Identity(index=0, node="n1", job_id="1", step_key="1.0.0", restart_count=0)
        ctl = Controller(cfg, ident)
        ctl.start()
        started.append(ctl)
        return ctl

    yield start
    for ctl in started:
        with ctl.lock:
            ctl.recovery.fail("test over")
            for view in ctl.agents.values():  # no agent will come for its exit plan
                view.lost = True
        ctl.join()
