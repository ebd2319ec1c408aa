"""``slurm-robust bench ckpt``: per-step checkpoint overhead, measured side by side.

Trains a GPT-like model on CPU on several gloo ranks (each rank its own "node", data
parallel with a gradient all-reduce) and alternates, round after round, between:

- ``none``: no checkpoint;
- ``snapshot``: the per-step snapshot into shared memory;
- ``snapshot_peer``: the snapshot plus the peer backup;
- ``torch_save``: ``torch.save`` of the same state every step;
- ``dcp_async_save``: ``torch.distributed.checkpoint.async_save`` every step (waiting for
  the previous save before starting the next, as its documentation asks).

The first round is a warm-up and is not counted. Each round runs every mode once in a
seeded shuffled order (the same on every rank); each block of steps is timed wall to wall
including the drain of its last checkpoint, so background work that spills past a step is
charged to its mode. Overheads are per-round ratios against ``none`` in the same round
(:mod:`slurm_robust_rehearsal.bench.abtest`): median, IQR, min..max, and "within noise"
when min..max covers zero. Also measured, on one process: the snapshot's copy
bandwidth beside a plain memcpy of the same bytes, and the checksum bandwidths.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict
from typing import Any

HELP = "per-step checkpoint overhead: snapshot, peer backup, torch.save, DCP async_save"

MODES = ("none", "snapshot", "snapshot_peer", "torch_save", "dcp_async_save")
#: Host memory of the checkpoint per rank, in states: three own snapshots with a peer
#: backup (a step common to all ranks survives a lost node: ckpt.config) and one backup.
MEMORY_BOUND_STATES = 4
QUICK = {"d_model": 128, "n_layers": 2, "vocab": 2048, "seq": 64, "batch": 2,
         "rounds": 2, "steps": 2}
# Between the two: big enough that the peer backup moves ~60 MB a step, small enough
# to measure on a shared 2-core machine in a few minutes.
MEDIUM = {"d_model": 256, "n_layers": 4, "vocab": 8192, "seq": 128, "batch": 2,
          "rounds": 5, "steps": 3}
FULL = {"d_model": 512, "n_layers": 8, "vocab": 16384, "seq": 256, "batch": 4,
        "rounds": 4, "steps": 3}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a small model, few steps")
    parser.add_argument("--medium", action="store_true",
                        help="a mid-size model (~5M parameters) for a busy machine")
    parser.add_argument("--ranks", type=int, default=2, help="gloo ranks (one per node)")
    parser.add_argument("--rounds", type=int, help="alternation rounds (first is warm-up)")
    parser.add_argument("--steps", type=int, help="steps per mode per round")
    parser.add_argument("--batch", type=int, help="sequences per rank per step")
    parser.add_argument("--checksum", default="sum64", choices=("sum64", "crc32"),
                        help="snapshot checksum (default sum64)")
    parser.add_argument("--workdir", help="scratch directory (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch.multiprocessing as mp

    # Lazy: torch; `slurm-robust bench --help` imports this module and must stay fast.
    from slurm_robust_rehearsal.bench.ckpt_modes import copy_bandwidth

    params = dict(QUICK if args.quick else MEDIUM if getattr(args, "medium", False) else FULL)
    for key in ("rounds", "steps", "batch"):
        if getattr(args, key, None):
            params[key] = getattr(args, key)
    if params["rounds"] < 2:
        raise SystemExit("bench ckpt: --rounds must be >= 2 (the first is a warm-up)")
    work = args.workdir or tempfile.mkdtemp(prefix="ckpt-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        port = _free_port()
        mp.spawn(_rank_main, args=(args.ranks, port, params, args.checksum, work,
                                   getattr(args, "seed", 0)),
                 nprocs=args.ranks, join=True)
        import torch
        per_rank = [torch.load(os.path.join(work, f"rank{r}.pt"), weights_only=True)
                    for r in range(args.ranks)]
        copy = copy_bandwidth(params, args.checksum)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return _summarise(params, args, per_rank, copy)


def _summarise(params: dict[str, Any], args: argparse.Namespace,
               per_rank: list[dict[str, Any]], copy: dict[str, Any]) -> dict[str, Any]:
    from slurm_robust_rehearsal.bench.abtest import compare

    # A step is as slow as its slowest rank: per round, the slowest rank's step time.
    rounds = {m: [max(r["rounds_s"][m][i] for r in per_rank)
                  for i in range(len(per_rank[0]["rounds_s"][m]))] for m in MODES}
    step_s = {m: statistics.median(v) for m, v in rounds.items()}
    spread = compare(rounds, "none", {"snapshot": 0.01, "snapshot_peer": 0.02})
    overhead = {m: spread[m]["median"] for m in MODES if m != "none"}
    r0 = per_rank[0]
    blocking = {m: r0["blocking_per_step_s"][m] for m in ("snapshot", "snapshot_peer")}
    result = {
        "config": dict(params, ranks=args.ranks, checksum=args.checksum, threads_per_rank=1,
                       n_params=r0["n_params"]),
        "state_bytes_per_rank": r0["state_bytes"],
        "step_s": step_s,
        "overhead_ratio": overhead,
        "overhead_spread": spread,
        "blocking_per_step_s": blocking,
        "blocking_ratio": {m: blocking[m] / step_s["none"] for m in blocking},
        "snapshot_overhead_vs_torch_save": (overhead["snapshot"] / overhead["torch_save"]
                                            if overhead["torch_save"] > 0 else None),
        "copy": copy,
        "memory": {
            "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
            "ckpt_host_bytes_per_rank": r0["host_bytes"],
            "bound_bytes": MEMORY_BOUND_STATES * r0["state_bytes"],
        },
        "pipeline_stats_rank0": r0["stats"],
    }
    result["targets"] = {
        # Met only when every counted round is within the target (overhead_spread).
        "snapshot_overhead_le_1pct": spread["snapshot"]["met"],
        "snapshot_peer_overhead_le_2pct": spread["snapshot_peer"]["met"],
        "copy_ge_70pct_memcpy": copy["snapshot_vs_memcpy"] >= 0.70,
        "memory_within_bound": r0["host_bytes"]["snapshot_peer"] <= MEMORY_BOUND_STATES
        * r0["state_bytes"],
    }
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, world: int, port: int, params: dict[str, Any], algo: str,
               work: str, seed: int = 0) -> None:
    import torch
    import torch.distributed as dist

    from slurm_robust_rehearsal.bench.abtest import round_order

    # Lazy: torch, as above (this runs in each spawned rank).
    from slurm_robust_rehearsal.bench.ckpt_modes import ModeRunner

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    runner = ModeRunner(rank, world, params, algo, work)
    try:
        times: dict[str, list[float]] = {m: [] for m in MODES}
        for rnd in range(params["rounds"]):
            order = round_order(MODES, rnd, seed)
            for mode in order:
                dist.barrier()
                t0 = time.perf_counter()
                runner.steps(mode, params["steps"])
                runner.drain(mode)
                dist.barrier()
                if rnd > 0:
                    times[mode].append((time.perf_counter() - t0) / params["steps"])
            if rnd == 0:
                runner.reset_stats()  # buffer allocation belongs to the warm-up
        out = {
            "rounds_s": times,
            "blocking_per_step_s": runner.blocking_per_step(),
            "state_bytes": runner.state_bytes(),
            "host_bytes": runner.host_bytes(),
            "n_params": runner.n_params,
            "stats": {m: asdict(s.stats) for m, s in runner.managers.items()},
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
        torch.save(out, os.path.join(work, f"rank{rank}.pt"))
    finally:
        runner.close()
        dist.destroy_process_group()
