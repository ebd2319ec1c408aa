"""Data-parallel training in the style of PyTorch's DDP tutorial, ported to slurm_robust.train.

The usual shape of a torchrun DDP script (a ``Trainer`` class, a ``DataLoader`` over a
``DistributedSampler``, epochs, ``set_epoch``), with the port's changes marked
``# robust:``: ``train.init`` instead of ``init_process_group``, ``run.restore`` instead
of loading a snapshot file, ``train.wrap_ddp`` instead of ``DistributedDataParallel``
and ``run.step_end`` after every optimizer step instead of saving every N epochs.

    torchrun --nproc-per-node 3 examples/train_ddp.py --epochs 3
    slurm-robust submit --nodes 3 --spares 1 -- python examples/train_ddp.py --epochs 3

The data position is ``(epoch, batches done in it)``: a restored run skips the batches its
snapshot already trained on and goes on with the same sampler order, so it ends with the
same parameters (``params_sha256=`` on rank 0's stdout, ``run_end`` in the event log) as a
run without faults. The model's layers are declared output first, so its gradients become
ready out of declaration order: exactly the case where plain DDP's bucket rebuild makes a
restarted process sum one step differently (see ``slurm_robust/ddp.py``).
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from slurm_robust import train


class SyntheticDataset(Dataset):
    """A fixed regression problem: ``size`` samples drawn once from ``seed``."""

    def __init__(self, size: int, in_dim: int, out_dim: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, in_dim, generator=g)
        w = torch.randn(in_dim, out_dim, generator=g)
        self.y = torch.tanh(self.x @ w) + 0.05 * torch.randn(size, out_dim, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Regressor(nn.Module):
    """An MLP declared head first (as config-built models often are)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.head = nn.Linear(hidden, out_dim)
        self.body = nn.Linear(hidden, hidden)
        self.stem = nn.Linear(in_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(torch.tanh(self.stem(x)))))


class Trainer:
    def __init__(self, model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                 run: train.RobustRun, min_step_time: float) -> None:
        self.run = run
        self.raw = model
        self.loader = loader
        self.optimizer = optimizer
        self.min_step_time = min_step_time
        # robust: the newest in-memory/peer/disk snapshot, before wrapping (as one
        # loads a snapshot file before DDP(...)); a fresh start returns 0.
        self.step = run.restore(model, optimizer)
        self.epoch, self.skip = run.data_position or (0, 0)
        if self.skip >= len(loader):  # the snapshot ended an epoch
            self.epoch, self.skip = self.epoch + 1, 0
        # robust: wrap_ddp, not DistributedDataParallel (a fixed bucket layout).
        self.model = train.wrap_ddp(model)

    def _run_batch(self, source: torch.Tensor,
                   targets: torch.Tensor) -> tuple[float, float]:
        with self.run.busy():
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
        grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.run.before_update()  # robust: the previous snapshot's copy is done
        self.optimizer.step()
        self.step += 1
        return loss.item(), grad_norm

    def _run_epoch(self, epoch: int, skip: int) -> None:
        self.loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        batches = itertools.islice(enumerate(self.loader), skip, None)
        for done, (source, targets) in batches:
            t0 = time.monotonic()
            loss, grad_norm = self._run_batch(source, targets)
            # robust: report the step and snapshot the state, with the data position.
            self.run.step_end(self.step, loss, grad_norm, self.raw, self.optimizer,
                              data_position=(epoch, done + 1))
            pad = self.min_step_time - (time.monotonic() - t0)
            if pad > 0:
                time.sleep(pad)
        if self.run.rank == 0:
            print(f"epoch {epoch}: step {self.step}, loss {loss:.5f}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epoch, max_epochs):
            self._run_epoch(epoch, self.skip if epoch == self.epoch else 0)


def get_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=32, help="samples per rank and step")
    p.add_argument("--batches", type=int, default=16, help="steps per epoch")
    p.add_argument("--hidden", type=int, default=512,
                   help="wide enough that gloo all-reduces in ring chunks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min_step_time", type=float, default=0.0,
                   help="pad each step to this many seconds (slows rehearsals)")
    p.add_argument("--events", default=None, help="standalone: event log for run_end")
    return p.parse_args()


def main() -> None:
    args = get_args()
    torch.set_num_threads(1)
    run = train.init()  # robust: instead of init_process_group
    torch.manual_seed(args.seed)
    data = SyntheticDataset(args.batch_size * args.batches * run.world_size, 16, 8, args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False,
                        sampler=DistributedSampler(data, num_replicas=run.world_size,
                                                   rank=run.rank, seed=args.seed))
    model = Regressor(16, args.hidden, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    trainer = Trainer(model, loader, optimizer, run, args.min_step_time)
    trainer.train(args.epochs)
    digest = train.params_digest(model)
    if run.rank == 0:
        print(f"params_sha256={digest} steps={trainer.step}", flush=True)
    run.finish(params_sha256=digest, events_path=args.events)


if __name__ == "__main__":
    main()
