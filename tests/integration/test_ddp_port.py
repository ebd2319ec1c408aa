"""The DDP-tutorial-style example ported to the training API, on the real mini-cluster.

examples/train_ddp.py is a torchrun DDP script (Trainer, DataLoader, DistributedSampler,
epochs) ported to slurm_robust.train with train.wrap_ddp; its model's gradients become
ready out of declaration order, so plain DDP would rebuild different buckets in a
restarted process (tests/unit/train/test_ddp_buckets.py holds that control). Three ranks
(one per node, gloo ring all-reduce) + one spare: after a killed worker (in-place restart
from memory) and a killed node (spare, restored from the peer backup) the final
params_sha256 must equal the fault-free run's, computed standalone torchrun-style.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import run_diagnostics, spare_path_victim, standalone_digest, wait_until

from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
CLI = [sys.executable, "-m", "slurm_robust.cli.main"]
NODES = 3
EPOCHS, BATCHES = 3, 12
TRAIN = ["--epochs", str(EPOCHS), "--batches", str(BATCHES)]


@pytest.fixture(scope="module")
def baseline_sha() -> str:
    """The fault-free digest: the example run standalone (torchrun-style env, no Slurm)."""
    return standalone_digest([sys.executable, str(EXAMPLE), *TRAIN], NODES)


class DdpRun:
    """A run of ``command`` (default: the DDP example) on NODES nodes and one spare."""

    def __init__(self, cluster, name: str, command: list[str] | None = None) -> None:
        self.env = cluster.env
        self.run_dir = str(cluster.cfg.shared_dir / f"test-ddp-{name}-{int(time.time() * 1e3)}")
        command = command or [sys.executable, str(EXAMPLE), *TRAIN, "--min_step_time",
                              "0.25"]
        argv = [*CLI, "submit", "--nodes", str(NODES), "--spares", "1", "--time", "15",
                "--folder", self.run_dir, "--json", "--hang-timeout", "8", "--", *command]
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr
        self.job_id = json.loads(out.stdout)["job_id"]
        self.paths = RunPaths.of(self.run_dir)

    def events(self, kind: str) -> list[dict]:
        return [e for e in read_records(self.paths.events).records if e["event"] == kind]

    def wait_step(self, step: int) -> None:
        try:
            wait_until(f"step {step} in {self.run_dir}",
                       lambda: any(e["step"] >= step for e in self.events("step")), 180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{run_diagnostics(self.run_dir, self.job_id)}") \
                from None

    def wait_end(self) -> dict:
        return wait_until(f"run_end in {self.run_dir}", lambda: self.events("run_end"),
                          240)[-1]

    def inject(self, fault: str, *args: str) -> None:
        out = subprocess.run([*CLI, "inject", fault, "--job", self.job_id, "--json", *args],
                             env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job_id], env=self.env, timeout=30)


@pytest.fixture
def ddp_run(minicluster):
    started: list[DdpRun] = []
    killed: list[str] = []

    def submit(name: str, command: list[str] | None = None) -> DdpRun:
        run = DdpRun(minicluster, name, command)
        started.append(run)
        return run

    submit.killed = killed  # type: ignore[attr-defined]
    yield submit
    for run in started:
        run.cancel()
    if killed:
        from slurm_robust_rehearsal.inject.job import revive_node

        for node in killed:
            revive_node(node)


def the_incident(run: DdpRun) -> dict:
    incidents = run.events("incident")
    assert len(incidents) == 1, incidents
    return incidents[0]


def test_ddp_port_kill_worker_is_bit_identical(ddp_run, baseline_sha):
    run = ddp_run("killworker")
    # Mid-epoch (step 16 is batch 4 of epoch 1): the restore skips the batches done.
    run.wait_step(16)
    run.inject("kill-worker", "--rank", str(NODES - 1))
    end = run.wait_end()
    inc = the_incident(run)
    assert (inc["class"], inc["rung"], inc["restore_tier"]) == \
        ("worker_signal", "in_place", "memory"), inc
    assert inc["steps_lost"] <= 1, inc
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end


def test_ddp_port_kill_node_is_bit_identical(ddp_run, baseline_sha):
    run = ddp_run("killnode")
    run.wait_step(16)
    controller = json.loads(run.paths.controller.read_text())["node"]
    victim = spare_path_victim(load_state(run.paths.state), controller)
    run.inject("kill-node", "--node", victim)
    ddp_run.killed.append(victim)
    end = run.wait_end()
    inc = the_incident(run)
    # The peer copy, unless the kill came right after a durable save of the same step
    # (then both hold the newest step and the restore may take either: nothing is lost).
    tier = inc["restore_tier"]
    if tier == "durable" and inc["steps_lost"] == 0 and \
            inc["restored_step"] == inc["last_step"]:
        tier = "peer"
    assert (inc["class"], inc["rung"], tier) == ("node_lost", "spare", "peer"), inc
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end
