"""A Hugging Face Trainer DDP run with the RobustCallback, several ranks, on the mini-cluster.

examples/train_hf.py is a transformers user's script (a tiny GPT-2 built from its config,
a Dataset, ``TrainingArguments``, ``Trainer``) with ``callbacks=[RobustCallback()]``.
Three ranks, one per node (gloo), and one spare, so srun's task count (4) is not the
world size: accelerate must take its ranks from the launcher's torchrun variables.
GPT-2's tied embedding gets its gradient last although it is declared first, where the
Trainer's own DDP would rebuild its buckets in a restarted process. After a killed worker
(in place, memory) and a killed node (spare, peer backup), each mid-epoch, the final
params_sha256 must equal the fault-free run's, run standalone torchrun-style without
Slurm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from slurm_robust.launcher.control.state import load_state
from tests.integration.cluster_helpers import spare_path_victim, standalone_digest
from tests.integration.test_ddp_port import NODES, ddp_run, the_incident  # noqa: F401

pytest.importorskip("transformers", reason="transformers is not installed "
                    "(optional extra: pip install 'slurm-robust[hf]')")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate "
                    "(optional extra: pip install 'slurm-robust[hf]')")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_hf.py"
# 288 samples / 3 ranks / batch 8: 12 steps an epoch; step 16 is batch 4 of epoch 1, so
# the restore skips epoch 0 whole and 4 batches of epoch 1.
TRAIN = ["--steps", "48"]
COMMAND = [sys.executable, str(EXAMPLE), *TRAIN, "--min-step-time", "0.25"]


@pytest.fixture(scope="module")
def hf_baseline() -> str:
    """The fault-free digest: the run standalone with torchrun's variables."""
    return standalone_digest([sys.executable, str(EXAMPLE), *TRAIN], NODES,
                             env_extra=lambda rank: {"LOCAL_WORLD_SIZE": "1",
                                                     "GROUP_RANK": str(rank)},
                             drop_env=("SLURM_ROBUST_PROGRESS", "SLURM_ROBUST_RUN_DIR",
                                       "SLURM_ROBUST_CKPT"))


def test_hf_kill_worker_is_bit_identical(ddp_run, hf_baseline):  # noqa: F811
    run = ddp_run("hf-killworker", COMMAND)
    run.wait_step(16)
    run.inject("kill-worker", "--rank", str(NODES - 1))
    end = run.wait_end()
    inc = the_incident(run)
    assert (inc["class"], inc["rung"], inc["restore_tier"]) == \
        ("worker_signal", "in_place", "memory"), inc
    assert inc["steps_lost"] <= 1, inc
    assert end["status"] == "completed", end
    assert end["step"] == 48 and end["params_sha256"] == hf_baseline, end


def test_hf_kill_node_is_bit_identical(ddp_run, hf_baseline):  # noqa: F811
    run = ddp_run("hf-killnode", COMMAND)
    run.wait_step(16)
    controller = json.loads(run.paths.controller.read_text())["node"]
    victim = spare_path_victim(load_state(run.paths.state), controller)
    run.inject("kill-node", "--node", victim)
    ddp_run.killed.append(victim)
    end = run.wait_end()
    inc = the_incident(run)
    assert (inc["class"], inc["rung"], inc["restore_tier"]) == \
        ("node_lost", "spare", "peer"), inc
    assert end["status"] == "completed", end
    assert end["step"] == 48 and end["params_sha256"] == hf_baseline, end
