"""A plain torchrun-style training script: it knows nothing of slurm_robust.

Written in the common single-file style: a small causal transformer on synthetic token
data, DistributedDataParallel when launched with several processes, gradient
accumulation, its own ``ckpt.pt`` every ``--ckpt_interval`` iterations, and an
``--init_from=resume`` switch that continues from that file.

    torchrun --nproc-per-node 2 examples/train_plain.py --out_dir out
    slurm-robust submit --nodes 2 --resume-args '--init_from=resume' \\
        --resume-if-exists out/ckpt.pt -- python examples/train_plain.py --out_dir out

Every batch is a function of (seed, iteration, rank), so a resumed run sees the same data
as an uninterrupted one from the checkpoint's iteration on.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def get_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out_dir", default="out")
    p.add_argument("--init_from", default="scratch", choices=["scratch", "resume"])
    p.add_argument("--max_iters", type=int, default=200)
    p.add_argument("--ckpt_interval", type=int, default=20)
    p.add_argument("--log_interval", type=int, default=10)
    p.add_argument("--grad_accum", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--vocab_size", type=int, default=64)
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_embd", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--iter_sleep", type=float, default=0.0,
                   help="extra seconds per iteration (stands in for a bigger model)")
    return p.parse_args()


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int = 4) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, n_layer: int, n_embd: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def get_batch(args: argparse.Namespace, it: int, micro: int, rank: int,
              device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic sequence: each token is the previous one times 3 plus 1."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + it * 1009 + micro * 31 + rank)
    start = torch.randint(0, args.vocab_size, (args.batch_size, 1), generator=g)
    steps = torch.arange(args.block_size + 1).unsqueeze(0)
    seq = (start * (3 ** steps) + ((3 ** steps) - 1) // 2) % args.vocab_size
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def main() -> None:
    args = get_args()
    ddp = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if ddp:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(device)
    else:
        rank, world, device = 0, 1, "cuda" if torch.cuda.is_available() else "cpu"
    master = rank == 0
    torch.manual_seed(args.seed)
    ckpt_path = os.path.join(args.out_dir, "ckpt.pt")

    model = TinyGPT(args.vocab_size, args.block_size, args.n_layer, args.n_embd).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    iter_num = 0
    if args.init_from == "resume":
        checkpoint = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        iter_num = checkpoint["iter_num"]
        if master:
            print(f"resuming from {ckpt_path} at iter {iter_num}", flush=True)
    raw_model = model
    if ddp:
        model = DDP(model, device_ids=[int(device.split(":")[1])] if "cuda" in device
                    else None)
    if master:
        os.makedirs(args.out_dir, exist_ok=True)

    t0 = time.time()
    while iter_num < args.max_iters:
        if iter_num > 0 and iter_num % args.ckpt_interval == 0 and master:
            torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num, "args": vars(args)}, ckpt_path)
            print(f"saved checkpoint at iter {iter_num}", flush=True)
        for micro in range(args.grad_accum):
            if ddp:
                # Synchronise gradients on the last micro-step only (the usual idiom).
                model.require_backward_grad_sync = micro == args.grad_accum - 1
            x, y = get_batch(args, iter_num, micro, rank, device)
            loss = model(x, y) / args.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.iter_sleep:
            time.sleep(args.iter_sleep)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        iter_num += 1
        if master and iter_num % args.log_interval == 0:
            lossf = loss.item() * args.grad_accum
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms", flush=True)
            if not math.isfinite(lossf):
                raise SystemExit(f"loss is {lossf} at iter {iter_num}")
    if master:
        print(f"done: {iter_num} iterations, world {world}", flush=True)
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
