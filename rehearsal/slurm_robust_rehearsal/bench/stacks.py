"""``slurm-robust bench stacks``: aggregation at scale and local capture speed.

Two numbers (issue targets: aggregation of 10,000 ranks under 2 s; capture of 8 local
processes under 3 s):

- ``aggregate``: a synthetic capture (realistic stack depth, a background thread and a
  data-loader child per rank) of ``--ranks`` ranks in a TP/PP/DP layout, with one
  pipeline's worth of faulty ranks; the time of :func:`analyze` alone, and whether it
  named the right group.
- ``capture``: ``--procs`` local Python processes, each with a child, stopped in a nested
  function; the time of :func:`capture_local` (py-spy, in parallel) over them.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_robust.layout import ParallelLayout
from slurm_robust.stacks.analyze import analyze
from slurm_robust.stacks.capture import CaptureOptions, capture_local
from slurm_robust.stacks.dumps import read_capture, write_rank_dump
from slurm_robust_rehearsal.synth.stacks import synthetic_capture

HELP = "stack aggregation over synthetic ranks, and capture of local processes"

# A process that forks one child and then both wait in a nested function.
_SLEEPER = """
import os, time
def wait_here():
    time.sleep(120)
def outer():
    wait_here()
os.fork()
outer()
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=10_000,
                        help="ranks in the synthetic capture (default 10000)")
    parser.add_argument("--procs", type=int, default=8,
                        help="local processes to capture (default 8; 0 skips)")
    parser.add_argument("--native", action="store_true", help="capture native frames too")
    parser.add_argument("--from-disk", action="store_true",
                        help="also time writing and reading the rank<r>.json files")


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"aggregate": bench_aggregate(args.ranks, args.from_disk)}
    if args.procs > 0:
        result["capture"] = bench_capture(args.procs, args.native)
    return result


def _layout_for(ranks: int):

    # tp=8 (one machine), pp=10, dp the rest: 10,000 ranks -> dp=125, 1,250 machines.
    # Other sizes not divisible by 80 run data-parallel only, 8 ranks a machine.
    tp, pp = (8, 10) if ranks % 80 == 0 else (1, 1)
    return ParallelLayout(tp=tp, pp=pp, dp=max(1, ranks // (tp * pp)), ranks_per_node=8)


def bench_aggregate(ranks: int, from_disk: bool = False) -> dict[str, Any]:

    layout = _layout_for(ranks)
    # One machine (a TP group) of the middle pipeline stuck in all_gather, the rest of
    # its pipeline waiting in send/recv (ByteRobust Fig. 7).
    victim = layout.world_size // 2
    pipeline = layout.group(victim, "pp")
    faults = {r: "irecv" for p in pipeline for r in layout.group(p, "tp")}
    faults.update({r: "all_gather" for r in layout.group(victim, "tp")})
    began = time.perf_counter()
    dumps = synthetic_capture(layout, faults)
    built = time.perf_counter() - began
    began = time.perf_counter()
    analysis = analyze(dumps, layout)
    elapsed = time.perf_counter() - began
    expected = set(layout.nodes_of(pipeline))
    result = {"ranks": layout.world_size, "layout": layout.describe(),
              "faulty_ranks": len(faults), "build_s": round(built, 3),
              "analyze_s": round(elapsed, 3), "level": analysis.level,
              "verdict": analysis.verdict,
              "evicted_dim": analysis.eviction.dim if analysis.eviction else None,
              "evicted_nodes": len(analysis.nodes),
              "correct": set(analysis.nodes) == expected, "target_s": 2.0}
    if from_disk:
        result.update(_disk_round_trip(dumps))
    return result


def _disk_round_trip(dumps: list) -> dict[str, Any]:

    with tempfile.TemporaryDirectory(prefix="sr-bench-stacks-") as tmp:
        began = time.perf_counter()
        for dump in dumps:
            write_rank_dump(tmp, dump)
        written = time.perf_counter() - began
        size = sum(p.stat().st_size for p in Path(tmp).iterdir())
        began = time.perf_counter()
        read_capture(tmp)
        loaded = time.perf_counter() - began
    return {"write_s": round(written, 3), "load_s": round(loaded, 3),
            "bytes_on_disk": size}


def bench_capture(procs: int, native: bool) -> dict[str, Any]:

    children = [subprocess.Popen([sys.executable, "-c", _SLEEPER],
                                 start_new_session=True) for _ in range(procs)]
    try:
        time.sleep(1.0)  # let them reach the nested sleep
        with tempfile.TemporaryDirectory(prefix="sr-bench-stacks-") as tmp:
            began = time.perf_counter()
            result = capture_local({r: p.pid for r, p in enumerate(children)}, "local",
                                   Path(tmp), CaptureOptions(native=native))
            elapsed = time.perf_counter() - began
            summary = result.summary()
    finally:
        for p in children:
            # Each sleeper leads its own session: the group holds it and its child.
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return {"processes": summary["processes"], "workers": procs, "native": native,
            "capture_s": round(elapsed, 3), "errors": summary["errors"],
            "methods": summary["methods"], "target_s": 3.0}
