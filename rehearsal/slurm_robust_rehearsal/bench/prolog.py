"""``slurm-robust bench prolog``: wall time of the node Prolog program, Python start included.

Runs ``<python> -I prolog/prolog.py`` the way slurmd's wrapper does, ``--runs`` times
(default 20), against a throw-away state directory (no injections, nothing journaled in
the real node journals), and reports the median against the 1.5 s target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError

HELP = "median wall time of the node prolog over N runs (Python start included)"
PROLOG = Path(__file__).resolve().parents[3] / "prolog" / "prolog.py"
TARGET_MEDIAN_S = 1.5
RUN_TIMEOUT_S = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=20, help="number of runs (default 20)")
    parser.add_argument("--node", default="benchnode", help="node name to check as")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.runs < 1:
        raise SlurmRobustError("--runs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="slurm_robust_bench_") as tmp:
        cfg = Path(tmp) / "config.json"
        cfg.write_text(json.dumps({"state_dir": f"{tmp}/{{node}}/state"}))
        env = {**os.environ, "SLURM_ROBUST_CONFIG": str(cfg), "SLURMD_NODENAME": args.node}
        times = [_one(i, env) for i in range(args.runs)]
    median = statistics.median(times)
    return {"benchmark": "prolog", "program": str(PROLOG), "python": sys.executable,
            "runs": args.runs, "median_s": round(median, 4), "min_s": round(min(times), 4),
            "max_s": round(max(times), 4),
            "p90_s": round(sorted(times)[int(0.9 * (len(times) - 1))], 4),
            "target_median_s": TARGET_MEDIAN_S, "within_target": median < TARGET_MEDIAN_S,
            "loadavg_1m": os.getloadavg()[0], "cpus": os.cpu_count()}


def _one(i: int, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-I", str(PROLOG)], env={**env,
                          "SLURM_JOB_ID": str(1000 + i)}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SlurmRobustError(f"prolog run {i} exited {proc.returncode}: "
                               f"{proc.stderr.strip()[-300:]}")
    return took
