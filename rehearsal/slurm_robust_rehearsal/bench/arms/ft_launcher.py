"""The ft_launcher peer: the torchrun arm's job with NVIDIA's ``ft_launcher``
(nvidia-resiliency-ext, a fork of torchrun's elastic agent with a rank monitor per rank)
in torchrun's place, the example sending one heartbeat per step through its client API
(see :func:`ft_launcher_script`); run only where ft_launcher is installed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from slurm_robust_rehearsal.bench.arms.base import (
    REPO,
    TORCHRUN_MAX_RESTARTS,
    RecoveryRun,
    Setup,
)
from slurm_robust_rehearsal.bench.arms.peers import (
    PeerBase,
    agent_script,
    elastic_args,
    elastic_worker,
)

FT_LAUNCHER_KEY = "nvidia_resiliency_ext_ft_launcher"
#: The program nvidia-resiliency-ext installs (its name, not the arm's).
EXECUTABLE = "ft_launcher"
#: How to make the ft_launcher arm available. A venv of its own, because installing the
#: package into the project's venv pulls pynvml 13, whose import hook then prints a
#: FutureWarning on every ``import torch`` and ``import pynvml`` there.
FT_LAUNCHER_ENABLE = (
    "not installed: python3 -m venv /tmp/ftl-venv && /tmp/ftl-venv/bin/pip install "
    "torch==2.13.0 nvidia-resiliency-ext==0.4.1 -e {repo} -e {repo}/rehearsal, then pass "
    "--ft-launcher "
    "/tmp/ftl-venv/bin/ft_launcher (or `.venv/bin/pip install nvidia-resiliency-ext==0.4.1` "
    "to find it next to this interpreter)")


def find_ft_launcher(path: str | None) -> str | None:
    """ft_launcher's executable: ``path``, else next to this interpreter, else on PATH."""
    if path:
        return path if os.access(path, os.X_OK) else None
    beside = Path(sys.executable).parent / EXECUTABLE
    return str(beside) if os.access(beside, os.X_OK) else shutil.which(EXECUTABLE)


def ft_launcher_script(launcher: str, nodes: int, max_restarts: int, port: int,
                       rdzv_prefix: str, worker: list[str]) -> str:
    """The batch script of the ft_launcher arm: the torchrun arm's script
    (:func:`slurm_robust_rehearsal.bench.arms.torchrun.torchrun_script`) with
    nvidia-resiliency-ext's ``ft_launcher`` (the executable ``launcher``) for torchrun.

    The options set are torchrun's arm's own (nodes, one worker per node, max restarts,
    c10d rendezvous on ``port``); everything else is ft_launcher's default, as its users
    run it: 0.1 s monitor interval (the agent, not a heartbeat timeout, sees the killed
    worker exit), restart policy any-failed, 30 s workers-stop timeout, heartbeat
    timeouts of 1 h / 45 min, the GPU and NIC health checks (they switch themselves off
    without NVML). TORCH_DISABLE_SHARE_RDZV_TCP_STORE does not apply: ft_launcher runs its
    own copy of torch 2.3's agent, which never shares the rendezvous store with the
    workers (rank 0's agent picks a free MASTER_PORT each round). ft_launcher starts the
    workers with its own interpreter, which must import slurm_robust,
    slurm_robust_rehearsal (the example's model) and nvidia_resiliency_ext (the example
    then sends a heartbeat per step).
    """
    agent = [launcher, *elastic_args(nodes, max_restarts, port, rdzv_prefix)]
    return agent_script(agent, None, worker)


class FtLauncher(PeerBase):
    label = "ft_launcher_max_restarts_dcp_async_save"
    speedup_key = "vs_ft_launcher"
    optional_key = FT_LAUNCHER_KEY
    port_offset = 250

    def missing(self, setup: Setup) -> str | None:
        return None if setup.ft_launcher else FT_LAUNCHER_ENABLE.format(repo=REPO)

    def script(self, run: RecoveryRun, port: int, worker: list[str]) -> str:
        assert run.setup.ft_launcher is not None  # select_arms only picks it when found
        return ft_launcher_script(run.setup.ft_launcher, run.args.nodes,
                                  TORCHRUN_MAX_RESTARTS, port, "bench-ftl",
                                  elastic_worker(worker))
