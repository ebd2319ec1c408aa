"""``slurm-robust bench simulate``: the fleet simulator's speed and memory at three sizes.

Each size (machines x days) runs the default ByteRobust mix with the event log written
to a temporary directory, in a fresh process so each peak RSS is that size's own. Each
size is run twice: the full run (event log written: wall time, events and records per
second, peak RSS) and the engine alone (no log: CPU time per engine event, an engine
event being a scheduled timeout: incident phases, machine lifecycles, reconciles).
Targets: the full 1,200-machine, 90-day run in under 60 s and 2 GiB, and engine CPU
per event within 3x across sizes (cost linear in events). CPU time is used for the
linearity check because wall time on a shared machine varies with load. The log is
linear in what it holds: one step record per simulated minute, and per attempt the
job's machine list (as the launcher writes it), so machines x incidents names.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

from slurm_robust.errors import SlurmRobustError

HELP = "events per second and peak memory of the fleet simulator at three sizes"
SIZES = ((300, 90.0), (1200, 90.0), (4800, 90.0))
TARGET = (1200, 90.0)
TARGET_S = 60.0
TARGET_MIB = 2048.0
LINEAR_SPREAD_MAX = 3.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def measure(machines: int, days: float, seed: int) -> dict[str, Any]:
    """One run in this process; returns its numbers."""
    from slurm_robust.simulate.config import byterobust_mix, byterobust_times
    from slurm_robust.simulate.engine import SimConfig, simulate

    cfg = SimConfig(machines=machines, days=days, mix=byterobust_mix(),
                    times=byterobust_times(machines), seed=seed)
    c0 = time.process_time()
    engine = simulate(cfg)
    engine_cpu = time.process_time() - c0
    with tempfile.TemporaryDirectory(prefix="sim-bench-") as tmp:
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(replace(cfg, run_dir=tmp))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"machines": machines, "days": days, "incidents": result.summary["incidents"],
            "engine_events": result.events, "records": result.records,
            "node_entries": result.node_entries,
            "elapsed_s": round(elapsed, 3), "cpu_s": round(cpu, 3),
            "events_per_s": round(result.events / elapsed, 1),
            "records_per_s": round(result.records / elapsed, 1),
            "engine_cpu_s": round(engine_cpu, 3),
            "engine_us_cpu_per_event": round(engine_cpu / engine.events * 1e6, 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                  1),
            "ettr": round(result.summary["ettr"], 5)}


def _child(machines: int, days: float, seed: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "slurm_robust_rehearsal.bench.simulate", str(machines),
            str(days), str(seed)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SlurmRobustError(f"simulator benchmark at {machines} machines x {days:g} days "
                               f"failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    results = [_child(m, d, args.seed) for m, d in SIZES]
    costs = [r["engine_us_cpu_per_event"] for r in results]
    spread = max(costs) / min(costs)
    target = next(r for r in results if (r["machines"], r["days"]) == TARGET)
    return {"benchmark": "simulate", "sizes": results,
            "cost_spread": round(spread, 2),
            "target": {"machines": TARGET[0], "days": TARGET[1], "elapsed_s_max": TARGET_S,
                       "peak_rss_mib_max": TARGET_MIB,
                       "cost_spread_max": LINEAR_SPREAD_MAX,
                       "met": (target["elapsed_s"] < TARGET_S
                               and target["peak_rss_mib"] < TARGET_MIB
                               and spread <= LINEAR_SPREAD_MAX)}}


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]), float(sys.argv[2]),
                             int(sys.argv[3]) if len(sys.argv) > 3 else 0)))
