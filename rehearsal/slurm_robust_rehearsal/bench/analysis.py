"""``slurm-robust bench analysis``: time and peak memory of the analysis at fleet scale.

What it measures: for each size, a child process builds a synthetic fleet directly as
arrays (:func:`slurm_robust_rehearsal.synth.fleet.synth_fleet`: per job one run of 8 step
records, a 10% chance of one incident with its rollback, attempt/run records, one health
record, one sacct record plus one per requeue, and node events and verdicts for blamed
nodes), then times :func:`pipeline.analyse` over it: ETTR per run, overall and on a
5-minute grid of 1-hour windows; per-incident metrics and the class/rung tables; the node
table; the fleet view with reserve sizing. Not included: reading JSON text and drawing
plots (the report draws at most 8 runs). Peak memory is the child's peak RSS (inputs and
analysis together).
It also checks the answers against the generator's exact ground truth.

Target: 1M jobs in under 60 s and under 4 GiB, time growing about linearly. Each size
prints its peak RSS and whether it fits that budget; the sliding-ETTR grid is bounded
(:data:`ettr.MAX_GRID_POINTS`) and evaluated in chunks, so a fleet of short runs keeps a
grid of a few million samples rather than ~36 per job.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

from slurm_robust.errors import SlurmRobustError

HELP = "time and peak memory of the post-mortem analysis at 10k, 100k and 1M jobs"
SIZES = (10_000, 100_000, 1_000_000)
TARGET_S = 60.0
TARGET_MIB = 4096.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, action="append", metavar="N",
                        help="job count to run (repeatable; default: 10k, 100k, 1M)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(n_jobs: int, seed: int = 0) -> dict[str, Any]:
    """Build and analyse one synthetic fleet in this process; returns the numbers."""
    # Lazy: pandas; `slurm-robust bench --help` imports this module and must stay fast.
    from slurm_robust.analysis.pipeline import analyse
    from slurm_robust_rehearsal.synth.fleet import synth_fleet

    t0 = time.perf_counter()
    inputs, truth = synth_fleet(n_jobs, seed=seed)
    built = time.perf_counter() - t0
    rss_inputs = _peak_mib()
    t0 = time.perf_counter()
    an = analyse(inputs)
    head = an.headline()
    elapsed = time.perf_counter() - t0
    ettr_true = truth.productive_s / truth.wall_s
    checks = {
        "ettr": abs(head["ettr"] - ettr_true) <= 1e-6 * ettr_true,
        "incidents": head["incidents"] == truth.incidents,
        "by_rung": all(head["by_rung"][r] == c for r, c in truth.by_rung.items()),
        "by_class": all(head["by_class"][k] == c for k, c in truth.by_class.items()),
        "steps_redone": head["steps_redone"] == truth.steps_redone,
    }
    log = inputs.log
    return {
        "jobs": n_jobs, "step_records": len(log.steps), "incidents": len(log.incidents),
        "sacct_records": len(inputs.sacct) if inputs.sacct is not None else 0,
        "node_events": len(inputs.node_events), "health_records": len(inputs.health),
        "window_points": len(an.sliding), "build_s": round(built, 3),
        "analyse_s": round(elapsed, 3), "peak_rss_mib": round(_peak_mib(), 1),
        "rss_after_build_mib": round(rss_inputs, 1), "ettr": head["ettr"],
        "checks_pass": all(checks.values()), "checks": checks,
    }


def _child(n_jobs: int, seed: int) -> dict[str, Any]:
    # A fresh process per size, so each peak RSS is that size's own.
    argv = [sys.executable, "-m", "slurm_robust_rehearsal.bench.analysis", str(n_jobs), str(seed)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SlurmRobustError(f"analysis benchmark at {n_jobs} jobs failed "
                               f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = args.jobs or list(SIZES)
    if any(n <= 0 for n in sizes):
        raise SlurmRobustError(f"--jobs must be positive, got {sizes}")
    results = [_child(n, args.seed) for n in sorted(sizes)]
    for r in results:
        # Every size is held to the 1M-job budget; only 1M makes the headline verdict.
        r["target"] = {"analyse_s_max": TARGET_S, "peak_rss_mib_max": TARGET_MIB,
                       "met": r["analyse_s"] < TARGET_S and r["peak_rss_mib"] < TARGET_MIB}
    out: dict[str, Any] = {"benchmark": "analysis", "sizes": results}
    if len(results) > 1:
        a, b = results[0], results[-1]
        per_job = [r["analyse_s"] / r["jobs"] * 1e6 for r in results]
        out["us_per_job"] = [round(x, 2) for x in per_job]
        out["time_growth_vs_jobs"] = round((b["analyse_s"] / a["analyse_s"])
                                           / (b["jobs"] / a["jobs"]), 2)
    big = [r for r in results if r["jobs"] >= 1_000_000]
    if big:
        r = big[-1]
        out["target"] = {"analyse_s_max": TARGET_S, "peak_rss_mib_max": TARGET_MIB,
                         "met": r["analyse_s"] < TARGET_S and r["peak_rss_mib"] < TARGET_MIB}
    return out


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)))
