"""Check and time the GPU path of the checkpoint package; prints one JSON object.

    python -m slurm_robust.ckpt.gpu_check [--steps N] [--layers N]

What it checks on a CUDA machine:

1. pinned buffers: the shared-memory snapshot buffers register as pinned pages;
2. side stream: ``snapshot`` returns before the device-to-host copy ends, ``wait`` only
   orders the current stream, and a restored snapshot equals the parameters bit for bit
   although the optimizer ran right after ``wait`` (no torn copy);
3. timing: step time with and without the per-step snapshot (alternating blocks), the
   blocking time per step and the D2H bandwidth;
4. NCCL backup (two or more GPUs): two ranks on two simulated nodes exchange backups
   over NCCL, and a rank whose node is "lost" restores from the peer tier;
5. the NVML, NCCL and determinism paths (``gpu_paths``): every GPU probe through the real
   NVML reader, the prolog and epilog suites with GPUs expected (``deep_collective`` over
   NCCL included), ``train.init()`` over NCCL, and the reference computation of the
   bitwise SDC test repeated bit for bit in fresh processes.

Exit status 0 when every part is ok, 1 when one is not; without CUDA it prints
``{"cuda": false, ...}`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch

from slurm_robust.ckpt.config import CheckpointConfig, job_dir_name, purge_job_memory
from slurm_robust.ckpt.manager import CheckpointManager
from slurm_robust.ckpt.state import capture_state
from slurm_robust_rehearsal.bench.gpu_paths import run_all as gpu_paths
from slurm_robust_rehearsal.workloads.gpt import GPT, GPTConfig, n_params


def _train_step(model: GPT, opt: torch.optim.Optimizer, idx: torch.Tensor,
                mgr: CheckpointManager | None, step: int) -> None:
    model.loss(idx).backward()
    if mgr is not None:
        mgr.wait()
    opt.step()
    opt.zero_grad(set_to_none=False)
    if mgr is not None:
        mgr.snapshot(step, capture_state(model, opt, None, data_position=step))


def single_gpu(steps: int, layers: int, root: str) -> dict[str, Any]:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    cfg = GPTConfig(n_layers=layers, d_model=1024, n_heads=16, seq=1024, vocab=32768)
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, cfg.vocab, (8, cfg.seq + 1), device=dev)
    ck = CheckpointConfig(shm_root=root, peer_backup=False)
    mgr = CheckpointManager(ck, 0, 1, "gpunode", "gpucheck")
    # The same pipeline with a one-thread checksum, interleaved with the default (four
    # threads for GPU state), so the A/B comparison shares the machine's state.
    ck1 = dataclasses.replace(ck, checksum_threads=1)
    mgr1 = CheckpointManager(ck1, 0, 1, "gpunode", "gpucheck1t")
    _train_step(model, opt, idx, mgr, 1)  # allocates and pins the buffers
    _train_step(model, opt, idx, mgr1, 1)
    mgr.flush()
    mgr1.flush()
    pinned = all(s is not None and s.pinned for s in mgr._slots)
    managers = {"none": None, "snapshot": mgr, "snapshot_1thread": mgr1}
    times: dict[str, list[float]] = {mode: [] for mode in managers}
    step = 1
    for _round in range(3):
        for mode, m in managers.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                step += 1
                _train_step(model, opt, idx, m, step)
            if m is not None:
                m.flush()
            torch.cuda.synchronize()
            times[mode].append((time.perf_counter() - t0) / steps)
    mgr1.close()
    purge_job_memory(ck1, job_dir_name(ck1, "gpucheck1t"))
    # The torn-copy check: snapshot, wait, mutate at once, then compare what was saved.
    expected = [p.detach().cpu().clone() for p in model.parameters()]
    mgr.snapshot(step + 1, capture_state(model, opt, None, data_position=0))
    mgr.wait()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    mgr.close()
    res = CheckpointManager(ck, 0, 1, "gpunode", "gpucheck").restore()
    restored = list(res.state["model"].values())
    exact = res.step == step + 1 and len(expected) == len(restored) and all(
        torch.equal(a, b) for a, b in zip(expected, restored, strict=True))
    none_s = min(times["none"])
    snap_s = min(times["snapshot"])
    # Per round, each mode against the no-snapshot block of the same round.
    rounds = {mode: [round(t / n - 1.0, 4) for t, n in zip(times[mode], times["none"],
                                                             strict=True)]
              for mode in ("snapshot", "snapshot_1thread")}
    stats = mgr.stats
    purge_job_memory(ck, job_dir_name(ck, "gpucheck"))
    return {
        "device": torch.cuda.get_device_name(dev), "n_params": n_params(model),
        "state_bytes": stats.state_bytes, "pinned": pinned, "restore_bit_exact": exact,
        "step_s": {"none": none_s, "snapshot": snap_s},
        "overhead_ratio": snap_s / none_s - 1.0,
        "overhead_1thread_checksum": min(times["snapshot_1thread"]) / none_s - 1.0,
        "overhead_by_round": rounds,
        "blocking_per_step_s": stats.blocking_s / max(stats.snapshots, 1),
        "d2h_GBps": stats.state_bytes * stats.snapshots / max(stats.copy_s, 1e-9) / 1e9,
        "checksum_s_per_step": stats.checksum_s / max(stats.snapshots, 1),
    }


def _nccl_rank(rank: int, world: int, port: int, root: str, out: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    nodes = [f"gpunode{r}" for r in range(world)]
    ck = CheckpointConfig(shm_root=root, peer_backup=True, chunk_bytes=8 << 20)
    torch.manual_seed(rank)
    model = GPT(GPTConfig(n_layers=4)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 16384, (4, 257), device="cuda")
    mgr = CheckpointManager(ck, rank, world, nodes[rank], "ncclcheck", rank_nodes=nodes)
    for step in range(1, 5):
        _train_step(model, opt, idx, mgr, step)
    mgr.flush()
    stats = mgr.stats.as_dict()
    mgr.close()
    dist.barrier()
    if rank == 0:  # rank 1's node is lost: only rank 0's backup of it survives
        purge_job_memory(ck, job_dir_name(ck, "ncclcheck"), nodes[1])
    dist.barrier()
    mgr = CheckpointManager(ck, rank, world, nodes[rank], "ncclcheck", rank_nodes=nodes)
    res = mgr.restore()
    expected = [p.detach().cpu() for p in model.parameters()]
    got = list(res.state["model"].values())
    exact = len(got) == len(expected) and all(
        torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    mgr.close()
    torch.save({"step": res.step, "tiers": res.tiers, "exact": exact, "stats": stats},
               os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def nccl_backup(root: str) -> dict[str, Any]:
    if torch.cuda.device_count() < 2:
        return {"skipped": "needs two GPUs (NCCL refuses two ranks on one device)"}
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_nccl_rank, args=(2, port, root, out), nprocs=2, join=True)
        ranks = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=True)
                 for r in range(2)]
    return {"ranks": ranks, "ok": all(r["exact"] for r in ranks)
            and ranks[1]["tiers"] == {0: "memory", 1: "peer"}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per timed block")
    parser.add_argument("--layers", type=int, default=12, help="GPT layers (d_model 1024)")
    args = parser.parse_args(argv)
    # Ask NVML, not the CUDA runtime, whether a GPU is there: nothing of this process may
    # sit on the GPU while the health suites run (gpu_procs).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "message": "no CUDA device: the GPU path of "
                          "slurm_robust.ckpt cannot be checked here; run this on a GPU node"}))
        return 2
    root = tempfile.mkdtemp(prefix="ckpt-gpu-", dir="/dev/shm")
    try:
        # The paths first: their health suites must see a GPU no process of ours holds
        # (gpu_procs fails a node with a compute process on it, this one included).
        paths = gpu_paths(torch.cuda.device_count())
        result = {"cuda": True, "torch": torch.__version__,
                  "single_gpu": single_gpu(args.steps, args.layers, root),
                  "nccl_backup": nccl_backup(root), "paths": paths}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    single = result["single_gpu"]
    result["ok"] = bool(single["restore_bit_exact"] and single["pinned"] and result["paths"]["ok"]
                        and result["nccl_backup"].get("ok", True))
    print(json.dumps(result, indent=2, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
