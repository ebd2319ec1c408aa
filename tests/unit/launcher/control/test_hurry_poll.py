"""The report intervals grow with the agents, so that the reports all of them are asked
for stay within what a controller serves: the hurried one (a failure settling) and the
steady heartbeat, with its timeout."""

from __future__ import annotations

import dataclasses
import json

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.cadence import (
    HURRY_POLL_S,
    HURRY_REPORTS_PER_S,
    STEADY_REPORTS_PER_S,
    TIMEOUT_BEATS,
    hurry_poll_s,
    scaled,
    settle_hurry_helps,
)
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.control.detectors import SETTLE_S
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.node.agent import Agent


def test_hurried_polls_stay_within_what_a_controller_serves():
    assert hurry_poll_s(2, 0.2) == HURRY_POLL_S  # a small run hurries as before
    for agents in (256, 1024, 4096):
        poll = hurry_poll_s(agents, 5.0)
        assert agents / poll <= HURRY_REPORTS_PER_S + 1e-6
    assert hurry_poll_s(4096, 0.2) == 0.2  # never slower than the heartbeat


def test_a_settling_failure_hurries_only_runs_whose_reports_can_end_it_early():
    # Up to 300 agents every one is heard within half the settle; past that the hurry
    # cannot end it before SETTLE_S and only loads the controller while it pushes.
    assert settle_hurry_helps(3, 0.2, SETTLE_S)
    assert settle_hurry_helps(300, 0.2, SETTLE_S)
    assert not settle_hurry_helps(301, 0.2, SETTLE_S)
    assert not settle_hurry_helps(4096, 4.096, SETTLE_S)
    assert not settle_hurry_helps(3, 0.05, SETTLE_S)  # the heartbeat is as quick already


# ---------------------------------------------------------------------- the steady beat
def _cfg(nodes: int, spares: int = 0, **kw: float) -> RunConfig:
    return RunConfig(command=("x",), run_dir="/nonexistent", nodes=nodes, spares=spares,
                     **kw)


def test_the_steady_heartbeat_grows_with_the_agents_past_a_few_hundred():
    assert scaled(_cfg(2)) == _cfg(2)  # a small run is left as configured
    assert scaled(_cfg(199, 1)).heartbeat_s == 0.2
    for nodes in (256, 1024, 4096):
        cfg = scaled(_cfg(nodes))
        assert nodes / cfg.heartbeat_s <= STEADY_REPORTS_PER_S + 1e-6
        assert cfg.heartbeat_timeout_s >= TIMEOUT_BEATS * cfg.heartbeat_s - 1e-9
        assert cfg.heartbeat_timeout_s >= 4.0  # never below the configured timeout
    assert scaled(_cfg(1024)).heartbeat_s == 1.024
    assert scaled(_cfg(1024)).heartbeat_timeout_s == 5.12
    assert scaled(_cfg(4000, 96)).heartbeat_timeout_s == 5 * 4.096
    # The spares report too: they count.
    assert scaled(_cfg(1000, 24)).heartbeat_s == 1.024


def test_scaling_twice_changes_nothing_and_larger_settings_are_kept():
    once = scaled(_cfg(4096))
    assert scaled(once) == once
    slow = scaled(_cfg(1024, heartbeat_s=2.0, heartbeat_timeout_s=30.0))
    assert (slow.heartbeat_s, slow.heartbeat_timeout_s) == (2.0, 30.0)


def test_the_controller_and_the_agents_derive_the_same_cadence(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"), nodes=1024, spares=0)
    ident = Identity(index=0, node="n1", job_id="1", step_key="1.0.0", restart_count=0)
    ctl = Controller(cfg, ident)
    assert ctl.cfg.heartbeat_s == 1.024 and ctl.cfg.heartbeat_timeout_s == 5.12
    assert ctl.recovery.cfg is ctl.cfg  # the detectors judge by the same timeout
    # The hurried poll is asked of them as before (it is never above the heartbeat).
    assert hurry_poll_s(1024, ctl.cfg.heartbeat_s) == 1024 / HURRY_REPORTS_PER_S
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"shm_root": str(tmp_path / "nodes/{node}/shm"),
                                "local_root": str(tmp_path / "nodes/{node}/local")}))
    node = Agent(dataclasses.replace(cfg, site_config=str(site), prewarm=()), ident)
    try:
        assert (node.cfg.heartbeat_s, node.cfg.heartbeat_timeout_s) == (1.024, 5.12)
    finally:
        if node.monitor is not None:
            node.monitor.stop()
        node.forks.close()
