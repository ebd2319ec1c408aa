"""A PyTorch Lightning DDP fit with slurm_robust's callback: one line in the Trainer.

    torchrun --nnodes 3 --nproc-per-node 1 ... examples/train_lightning.py   # plain Lightning
    slurm-robust submit --nodes 3 --spares 1 -- python examples/train_lightning.py

The LightningModule, its dataloader and the Trainer are written as a Lightning user
writes them; the robust part is ``callbacks=[RobustCallback()]`` (outside the launcher
it does nothing). Under the launcher every step is snapshotted in memory (with a peer
backup and the disk tiers), reported for hang, NaN and fail-slow detection, and a
restarted worker resumes from the newest snapshot: parameters, AdamW and LR scheduler
state, and Lightning's fit loop including the dataloader's position mid-epoch (the
loader below is resumable, as torchdata's StatefulDataLoader is).

The world comes from torchrun's variables, which the launcher sets too: ``num_nodes *
devices`` must equal ``WORLD_SIZE``. Rank 0 prints ``params_sha256=`` at the end: a run
with faults ends with the same digest as one without.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # the unified package first, then the standalone one
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

from slurm_robust import train
from slurm_robust.integrations.lightning import RobustCallback


class ResumableLoader(DataLoader):
    """A DataLoader Lightning can resume mid-epoch (``state_dict``/``load_state_dict``):
    it counts the batches handed out in the current epoch and skips them after a
    restore."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served, self.skip = 0, 0

    def __iter__(self):  # type: ignore[override]
        it = super().__iter__()
        for _ in range(self.skip):
            next(it)
        self.served, self.skip = self.skip, 0
        for batch in it:
            self.served += 1
            yield batch
        self.served = 0  # the epoch ended: the next one starts at its first batch

    def state_dict(self) -> dict[str, int]:
        # After an epoch's last batch the epoch is over: Lightning resumes such a state
        # with the next epoch, which must start at its first batch, not skip a whole
        # epoch (torchdata's StatefulDataLoader had the same bug: meta-pytorch/data#1437).
        return {"served": 0 if self.served >= len(self) else self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = int(state["served"])


class Regressor(pl.LightningModule):
    """An MLP declared head first, so its gradients become ready out of declaration
    order (the case where DDP's bucket rebuild would change a restarted process)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        torch.manual_seed(args.seed)
        self.head = nn.Linear(64, 4)
        self.body = nn.Linear(64, 64)
        self.stem = nn.Linear(16, 64)
        g = torch.Generator().manual_seed(args.seed + 1)
        x = torch.randn(args.samples, 16, generator=g)
        w = torch.randn(16, 4, generator=g)
        self.data = TensorDataset(x, torch.tanh(x @ w) + 0.05 * torch.randn(
            args.samples, 4, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(torch.tanh(self.stem(x)))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        started = time.monotonic()
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        # A stand-in for a real model's step time (faults are injected mid-run).
        time.sleep(max(0.0, self.args.min_step_time - (time.monotonic() - started)))
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> DataLoader:
        sampler = DistributedSampler(self.data, num_replicas=self.trainer.world_size,
                                     rank=self.trainer.global_rank, shuffle=True,
                                     seed=self.args.seed)
        return ResumableLoader(self.data, batch_size=self.args.batch, sampler=sampler)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--samples", type=int, default=288)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-step-time", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch's intra-op threads (default: torch's own choice). The bits "
                        "of a reduction depend on it: runs compared digest to digest must "
                        "use the same count")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    model = Regressor(args)
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="cpu", devices=per_node,
        num_nodes=max(1, world // per_node), strategy="ddp" if world > 1 else "auto",
        use_distributed_sampler=False,  # train_dataloader shards the data itself
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[RobustCallback()])
    trainer.fit(model)
    if trainer.global_rank == 0:
        print(f"params_sha256={train.params_digest(model)} step={trainer.global_step}",
              flush=True)


if __name__ == "__main__":
    main()
