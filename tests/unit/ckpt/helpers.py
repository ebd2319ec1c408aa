"""A tiny deterministic training loop for the checkpoint tests (single and multi rank).

Every source of randomness a real run has is used, so that a restore which forgets one
(dropout -> torch RNG, data noise -> numpy, shuffling -> python random, data position,
Adam moments, the LR schedule) changes the final parameters.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from slurm_robust import ckpt

DIM = 16


@dataclass
class Trainer:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    data_position: int = 0
    step: int = 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_trainer(rank: int, seed: int = 0) -> Trainer:
    seed_everything(seed + rank)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.ReLU(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(32, DIM),
                                torch.nn.LayerNorm(DIM))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    return Trainer(model, optimizer, scheduler)


def batch(rank: int, position: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * rank + position)
    x = torch.randn(8, DIM, generator=g)
    noise = torch.from_numpy(np.random.standard_normal((8, DIM)).astype(np.float32))
    perm = list(range(8))
    random.shuffle(perm)
    return x[perm], (x * 0.5 + 0.1 * noise)[perm]


def train(t: Trainer, rank: int, until: int, mgr: ckpt.CheckpointManager | None,
          reduce_group: bool = False) -> None:
    """Train from ``t.step`` to ``until``, snapshotting after every optimizer step."""
    while t.step < until:
        x, y = batch(rank, t.data_position)
        loss = torch.nn.functional.mse_loss(t.model(x), y)
        loss.backward()
        if reduce_group:  # a training collective running beside the peer-backup traffic
            dist.all_reduce(loss.detach().clone())
        if mgr is not None:
            mgr.wait()
        t.optimizer.step()
        t.optimizer.zero_grad()
        t.scheduler.step()
        t.data_position += 1
        t.step += 1
        if mgr is not None:
            mgr.snapshot(t.step, ckpt.capture_state(t.model, t.optimizer, t.scheduler,
                                                     data_position=t.data_position,
                                                     extras={"step": t.step}))


def resume(t: Trainer, mgr: ckpt.CheckpointManager) -> ckpt.RestoreResult:
    result = mgr.restore()
    if result.step is not None:
        assert result.state is not None
        t.data_position = ckpt.apply_state(result.state, t.model, t.optimizer, t.scheduler)
        t.step = result.state["extras"]["step"]
    return result


def params(t: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.model.parameters()]


def reference_params(rank: int, steps: int) -> list[torch.Tensor]:
    """Final parameters of an uninterrupted run (no checkpointing at all)."""
    torch.set_num_threads(1)  # the workers run one thread; reduction order must match
    t = make_trainer(rank)
    train(t, rank, steps, None)
    return params(t)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dist_worker(rank: int, world: int, port: int, cfg: ckpt.CheckpointConfig,
                nodes: list[str], job: str, until: int, crash: bool, out_dir: str) -> None:
    """One rank of a multi-rank run (torch.multiprocessing.spawn target).

    Restores (whatever is there), trains to ``until`` and either dies without closing
    (``crash``: after flushing, so the test knows which step every tier holds) or writes
    its restore result and final parameters to ``out_dir``.
    """
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mgr = ckpt.CheckpointManager(cfg, rank, world, nodes[rank], job)
    t = make_trainer(rank)
    result = resume(t, mgr)
    train(t, rank, until, mgr, reduce_group=True)
    mgr.flush()
    if crash:
        os._exit(0)  # no close(), no cleanup: what a killed worker leaves behind
    torch.save({"step": result.step, "tiers": result.tiers, "params": params(t),
                "peer": mgr.peer, "stats": mgr.stats.as_dict()},
               os.path.join(out_dir, f"rank{rank}.pt"))
    mgr.close()
    dist.destroy_process_group()
