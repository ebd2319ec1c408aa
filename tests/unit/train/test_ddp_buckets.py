"""DDP restarts end bit-identical with slurm_robust.ddp.wrap_ddp (3 gloo processes, CPU).

The model's parameters are declared in the opposite order of their use, so gradients
become ready out of declaration order and DDP's bucket rebuild changes the layout. Three
ranks: with two, the all-reduce is a + b = b + a exactly and no layout can matter.
The plain-DDP control must differ, or the test would prove nothing.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from slurm_robust.ddp import wrap_ddp

WORLD = 3
STEPS, CUT = 6, 3
#: Wide enough (1 MiB of weights) that gloo all-reduces in ring chunks; tiny buffers are
#: reduced in one fixed order whatever the layout.
H = 512


class OutOfOrder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # Declared last-used first: the backward makes c's gradient ready before a's.
        self.c = nn.Linear(H, 8)
        self.b = nn.Linear(H, H)
        self.a = nn.Linear(16, H)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(32, 16, generator=g), torch.randn(32, 8, generator=g)


def train(wrap, state: dict | None, first: int, last: int, rank: int) -> dict:
    torch.manual_seed(0)
    model = OutOfOrder()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    ddp = wrap(model)  # a fresh wrapper: a fresh reducer, as in a restarted process
    for step in range(first, last):
        x, y = batch(rank, step)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "opt": opt.state_dict()}


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.nn.parallel import DistributedDataParallel as DDP

    results = {}
    for name, wrap in (("plain", DDP), ("fixed", wrap_ddp)):
        whole = train(wrap, None, 0, STEPS, rank)
        half = train(wrap, None, 0, CUT, rank)
        restarted = train(wrap, half, CUT, STEPS, rank)
        results[name] = same(whole["model"], restarted["model"])
    dist.destroy_process_group()
    out[rank] = results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_restart_is_bit_identical_with_wrap_ddp():
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, port, out)) for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=240)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        results = dict(out)
    assert all(results[r]["fixed"] for r in range(WORLD)), results
    # The control: plain DDP's first step after the restart reduced with other buckets.
    assert not any(results[r]["plain"] for r in range(WORLD)), results
