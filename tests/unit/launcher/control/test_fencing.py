"""Fencing of a partitioned node: the controller refuses an agent it declared
lost, and an agent cut off from both its controller and slurmctld stands down."""

from __future__ import annotations

import json
import sys
import time

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import Progress, Report
from slurm_robust.launcher.node import fence


def ident(i: int, job: str = "777") -> Identity:
    return Identity(index=i, node=f"n{i + 1}", job_id=job, step_key=f"{job}.0.0",
                    restart_count=0)


def _controller(tmp_path, monkeypatch) -> Controller:
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"shm_root": str(tmp_path / "nodes/{node}/shm")}))
    cfg = RunConfig(command=(sys.executable, "-c", "pass"), run_dir=str(tmp_path / "run"),
                    nodes=2, spares=1, site_config=str(site), local_every=0,
                    durable_every=0)
    return Controller(cfg, ident(0))


def _report(agent: int, gen: int, step: int | None = None) -> Report:
    progress = [Progress.from_json({"kind": "step", "rank": 1, "step": step, "t": 1.0,
                                    "loss": 1.0, "grad_norm": 1.0})] if step else []
    return Report(op="report", agent=agent, node=f"n{agent + 1}", pid=100 + agent,
                  key="777.0.0", time=time.time(), addr="127.0.0.1", gen=gen,
                  role=Role.ACTIVE, progress=progress)


def test_an_agent_declared_lost_is_told_to_stand_down_and_not_heard(tmp_path, monkeypatch):
    ctl = _controller(tmp_path, monkeypatch)
    view = ctl.on_report(_report(1, gen=-1), time.time())
    assert view is not None and ctl._plan_for(view) is None  # no generation yet
    view.lost = True  # what _check_agents does after the heartbeat timeout
    seen = view.last_seen
    again = ctl.on_report(_report(1, gen=1, step=7), time.time() + 5)
    assert again is view
    assert view.last_seen == seen and view.gen == -1  # nothing it said was taken
    plan = ctl._plan_for(view)
    assert plan is not None and plan.role is Role.EXIT and plan.exit_code == 0
    assert not plan.purge  # its node's files are left for the post-mortem


def test_the_controllers_own_node_is_never_fenced(tmp_path, monkeypatch):
    ctl = _controller(tmp_path, monkeypatch)
    view = ctl.on_report(_report(0, gen=-1), time.time())
    assert view is not None
    view.lost = True
    assert not ctl._fenced(view)


def test_an_agent_cut_off_from_slurmctld_too_stands_down(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setattr(fence.Slurm, "ping", lambda self: False)
    assert fence.standing_down(ident(1))
    monkeypatch.setattr(fence.Slurm, "ping", lambda self: True)
    assert not fence.standing_down(ident(1))  # slurmctld answers: the controller is lost


def test_outside_slurm_an_agent_never_stands_down(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(fence.Slurm, "ping", lambda self: False)
    assert not fence.standing_down(ident(1, job="local"))
