"""The Python executor (submitit-style) and `slurm-robust launch` on the mini-cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_robust.launcher.errors import RunStopped
from slurm_robust.launcher.submit.executor import RobustExecutor
from slurm_robust.records import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def train_fn(steps: int, bug_at: int | None = None) -> dict:
    """Runs on every rank: a tiny linear model, data parallel, through slurm_robust.train."""
    import torch

    from slurm_robust import train

    torch.set_num_threads(1)
    torch.manual_seed(0)
    run = train.init()
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = run.restore(model, opt)
    for step in range(start, steps):
        if bug_at is not None and step + 1 == bug_at:
            raise KeyError("deliberate")
        g = torch.Generator().manual_seed(step * 100 + run.rank)
        x = torch.randn(32, 16, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            torch.distributed.all_reduce(p.grad)
            p.grad /= run.world_size
        run.before_update()
        opt.step()
        run.step_end(step + 1, loss.item(), None, model, opt, data_position=step + 1)
    digest = train.params_digest(model)
    run.finish(params_sha256=digest)
    return {"rank": run.rank, "world": run.world_size, "sha": digest}


def test_executor_submit_returns_rank0_result(minicluster, monkeypatch):
    for key, value in minicluster.env.items():
        monkeypatch.setenv(key, value)
    folder = minicluster.cfg.shared_dir / f"test-executor-{int(time.time() * 1000)}"
    ex = RobustExecutor(folder=folder, spares=1, hang_floor_s=20)
    ex.update_parameters(nodes=2, time=10, local_every=0, durable_every=0)
    with pytest.raises(Exception, match="unknown parameter"):
        ex.update_parameters(gpus=8)
    job = ex.submit(train_fn, 20)
    assert job.job_id.isdigit()
    result = job.result(poll_s=1)
    assert result["rank"] == 0 and result["world"] == 2
    ends = [e for e in job.events() if e["event"] == "run_end"]
    assert ends[-1]["status"] == "completed" and ends[-1]["params_sha256"] == result["sha"]


def test_executor_stopped_run_raises_its_verdict(minicluster, monkeypatch):
    for key, value in minicluster.env.items():
        monkeypatch.setenv(key, value)
    folder = minicluster.cfg.shared_dir / f"test-executor-stop-{int(time.time() * 1000)}"
    ex = RobustExecutor(folder=folder, nodes=2, time=10, spares=0)
    job = ex.submit(train_fn, 20, bug_at=5)
    with pytest.raises(RunStopped, match="KeyError"):
        job.result(poll_s=1)


def test_launch_inside_own_sbatch_script(minicluster):
    run_dir = minicluster.cfg.shared_dir / f"test-launch-{int(time.time() * 1000)}"
    script = run_dir.with_suffix(".sbatch")
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 3", "#SBATCH --requeue", "#SBATCH -t 10",
        f"cd {REPO}",
        f"{sys.executable} -m slurm_robust.cli.main launch --spares 1 --folder {run_dir} -- "
        f"{sys.executable} examples/train_gpt.py --steps 15", ""]))
    out = subprocess.run(["sbatch", "--parsable", "-o", f"{run_dir}.out", str(script)],
                         env=minicluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    deadline = time.time() + 240
    ends: list = []
    while time.time() < deadline and not ends:
        time.sleep(1)
        ends = [e for e in read_records(run_dir / "events.jsonl").records
                if e["event"] == "run_end"]
    subprocess.run(["scancel", job], env=minicluster.env, timeout=30)
    assert ends and ends[-1]["status"] == "completed", f"see {run_dir}.out"
    start = next(e for e in read_records(run_dir / "events.jsonl").records
                 if e["event"] == "run_start")
    assert len(start["nodes"]) == 2 and len(start["spares"]) == 1
    assert start["job_id"] == job and os.path.exists(run_dir / "agents")


def test_own_sbatch_script_with_no_kill_survives_a_node_loss_on_its_spare(minicluster):
    """docs/USER_GUIDE.md: a hand-written batch script for `slurm-robust launch` asks for
    `--requeue --no-kill`; with them a lost worker node is replaced by the in-job spare.
    Four nodes: three active (the batch node and the controller's are not the victim:
    their loss takes other rungs) and the spare."""
    from cluster_helpers import spare_path_victim

    from slurm_robust.launcher.control.state import load_state
    from slurm_robust.launcher.paths import RunPaths
    from slurm_robust_rehearsal.inject.job import revive_node

    run_dir = minicluster.cfg.shared_dir / f"test-launch-nokill-{int(time.time() * 1000)}"
    script = run_dir.with_suffix(".sbatch")
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 4", "#SBATCH --requeue", "#SBATCH --no-kill",
        "#SBATCH -t 10", f"cd {REPO}",
        f"{sys.executable} -m slurm_robust.cli.main launch --spares 1 --folder {run_dir} "
        f"--hang-timeout 8 -- {sys.executable} examples/train_gpt.py --steps 60 "
        "--min-step-time 0.2", ""]))
    out = subprocess.run(["sbatch", "--parsable", "-o", f"{run_dir}.out", str(script)],
                         env=minicluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    paths = RunPaths.of(run_dir)
    victim = None

    def events(kind: str) -> list[dict]:
        if not paths.events.exists():
            return []
        return [e for e in read_records(paths.events).records if e["event"] == kind]

    try:
        deadline = time.time() + 180
        while time.time() < deadline and not any(e["step"] >= 10 for e in events("step")):
            time.sleep(0.5)
        assert any(e["step"] >= 10 for e in events("step")), f"no step 10; see {run_dir}.out"
        controller = json.loads(paths.controller.read_text())["node"]
        victim = spare_path_victim(load_state(paths.state), controller)
        inj = subprocess.run([sys.executable, "-m", "slurm_robust.cli.main", "inject",
                              "kill-node", "--job", job, "--node", victim, "--json"],
                             env=minicluster.env, capture_output=True, text=True, timeout=60)
        assert inj.returncode == 0, inj.stderr
        deadline = time.time() + 240
        while time.time() < deadline and not events("run_end"):
            time.sleep(0.5)
        ends = events("run_end")
        assert ends and ends[-1]["status"] == "completed", f"see {run_dir}.out"
        incidents = events("incident")
        assert [(i["class"], i["rung"]) for i in incidents] == [("node_lost", "spare")], \
            incidents
    finally:
        subprocess.run(["scancel", job], env=minicluster.env, timeout=30)
        if victim is not None:
            revive_node(victim)
