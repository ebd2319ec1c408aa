"""Collective loopback worker: ``python -I -m slurm_robust.health.collective ...``.

Runs ``world`` ranks on this node (rank 0 here, the others forked before any CUDA or
collective state exists), all-reduces a tensor of known values and prints one JSON line:
``{"ok": bool, "world": int, "backend": str, "seconds": float, "gbps": float, ...}``.
The ``deep_collective`` check runs it as a subprocess with a timeout, so a hung collective
is killed instead of hanging the epilog, and torch stays out of the epilog's own process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any


def _rank(rank: int, world: int, backend: str, numel: int, store: str,
          timeout_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        device = torch.device("cpu")
        if backend == "nccl":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        t = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        expected = world * (world + 1) / 2
        max_err = float((t - expected).abs().max().item())
    finally:
        dist.destroy_process_group()
    return {"rank": rank, "ok": max_err == 0.0, "max_err": max_err, "seconds": seconds}


def _child(rank: int, world: int, backend: str, numel: int, store: str,
           timeout_s: float) -> None:
    result = _rank(rank, world, backend, numel, store, timeout_s)
    os._exit(0 if result["ok"] else 3)


def run(world: int, backend: str, numel: int, timeout_s: float) -> dict[str, Any]:
    import torch  # noqa: F401 - imported once here so forked ranks inherit it

    # The FileStore's file sits in a fresh private (0700) directory: a name in /tmp
    # itself could be recreated by another user between our choosing it and the store
    # opening it (the collective then hangs and the node is drained). Nobody else can
    # create anything inside our own 0700 directory.
    store_dir = tempfile.mkdtemp(prefix="slurm_robust_collective_")
    store = os.path.join(store_dir, "store")  # FileStore wants a path that does not exist
    ctx = mp.get_context("fork")
    children = [ctx.Process(target=_child, args=(r, world, backend, numel, store, timeout_s))
                for r in range(1, world)]
    for c in children:
        c.start()
    try:
        result = _rank(0, world, backend, numel, store, timeout_s)
    finally:
        for c in children:
            c.join(timeout_s)
            if c.is_alive():
                c.kill()
        shutil.rmtree(store_dir, ignore_errors=True)
    codes = [c.exitcode for c in children]
    ok = result["ok"] and all(code == 0 for code in codes)
    # all_reduce moves about 2 (w-1)/w of the buffer per rank (ring algorithm).
    moved = 2 * (world - 1) / max(world, 1) * numel * 4
    return {"ok": ok, "world": world, "backend": backend, "numel": numel,
            "seconds": round(result["seconds"], 6), "max_err": result["max_err"],
            "gbps": round(moved / max(result["seconds"], 1e-9) / 1e9, 3),
            "child_exit_codes": codes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slurm_robust.health.collective")
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--backend", choices=("gloo", "nccl"), required=True)
    p.add_argument("--numel", type=int, required=True)
    p.add_argument("--timeout-s", type=float, required=True)
    a = p.parse_args(argv)
    if a.world < 1 or a.numel < 1:
        p.error("--world and --numel must be >= 1")
    out = run(a.world, a.backend, a.numel, a.timeout_s)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
