"""The framework callbacks on the mini-cluster: a PyTorch Lightning DDP fit and a Hugging
Face Trainer run, each with its RobustCallback, several ranks.

examples/train_lightning.py is a Lightning user's script (LightningModule, its own
sharded resumable dataloader, ``strategy="ddp"``); examples/train_hf.py a transformers
user's (a tiny GPT-2 built from its config, a Dataset, ``TrainingArguments``,
``Trainer``). Three ranks, one per node (gloo), and one spare, so srun's task count (4) is
not the world size: the framework must take its ranks from the launcher's torchrun
variables. In both, gradients become ready out of declaration order (GPT-2's tied
embedding gets its gradient last although it is declared first), where the framework's
own DDP would rebuild its buckets in a restarted process. After a killed worker (in place,
memory) and a killed node (spare, peer backup), each mid-epoch, the final params_sha256
must equal the fault-free run's, run standalone torchrun-style without Slurm.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_robust.launcher.control.state import load_state
from tests.integration.cluster_helpers import spare_path_victim, standalone_digest
from tests.integration.test_ddp_port import NODES, ddp_run, the_incident  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: Framework -> (its example, the modules it needs, the extra that installs them).
FRAMEWORKS = {
    "lightning": ("train_lightning.py", ("pytorch_lightning",), "lightning"),
    "hf": ("train_hf.py", ("transformers", "accelerate"), "hf"),
}
# 288 samples / 3 ranks / batch 8: 12 steps an epoch; step 16 is batch 4 of epoch 1, so
# the restore skips epoch 0 whole and 4 batches of epoch 1. One intra-op thread on both
# sides: GPT-2's reductions round differently with two (the reference once ran with the
# test process's OMP_NUM_THREADS, the cluster ranks with the machine's core count).
TRAIN = ["--steps", "48", "--threads", "1"]


def _framework(name: str) -> Any:
    _, modules, extra = FRAMEWORKS[name]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.param(name, id=name, marks=pytest.mark.skipif(
        bool(missing), reason=f"{', '.join(missing)} not installed (optional extra: pip "
                              f"install 'slurm-robust[{extra}]')"))


@pytest.fixture(scope="module", params=[_framework(n) for n in FRAMEWORKS])
def framework(request: pytest.FixtureRequest) -> tuple[str, list[str], str]:
    """The framework's name, its worker command and its fault-free digest (the run
    standalone with torchrun's variables)."""
    example = str(REPO / "examples" / FRAMEWORKS[request.param][0])
    digest = standalone_digest([sys.executable, example, *TRAIN], NODES,
                               env_extra=lambda rank: {"LOCAL_WORLD_SIZE": "1",
                                                       "GROUP_RANK": str(rank)},
                               drop_env=("SLURM_ROBUST_PROGRESS", "SLURM_ROBUST_RUN_DIR",
                                         "SLURM_ROBUST_CKPT"))
    command = [sys.executable, example, *TRAIN, "--min-step-time", "0.25"]
    return request.param, command, digest


def _completed_as_baseline(end: dict, baseline: str) -> None:
    assert end["status"] == "completed", end
    assert end["step"] == 48 and end["params_sha256"] == baseline, end


def test_kill_worker_is_bit_identical(ddp_run, framework):  # noqa: F811
    name, command, baseline = framework
    run = ddp_run(f"{name}-killworker", command)
    run.wait_step(16)
    run.inject("kill-worker", "--rank", str(NODES - 1))
    end = run.wait_end()
    inc = the_incident(run)
    assert (inc["class"], inc["rung"], inc["restore_tier"]) == \
        ("worker_signal", "in_place", "memory"), inc
    assert inc["steps_lost"] <= 1, inc
    _completed_as_baseline(end, baseline)


def test_kill_node_is_bit_identical(ddp_run, framework):  # noqa: F811
    name, command, baseline = framework
    run = ddp_run(f"{name}-killnode", command)
    run.wait_step(16)
    controller = json.loads(run.paths.controller.read_text())["node"]
    victim = spare_path_victim(load_state(run.paths.state), controller)
    run.inject("kill-node", "--node", victim)
    ddp_run.killed.append(victim)
    end = run.wait_end()
    inc = the_incident(run)
    assert (inc["class"], inc["rung"], inc["restore_tier"]) == \
        ("node_lost", "spare", "peer"), inc
    _completed_as_baseline(end, baseline)
