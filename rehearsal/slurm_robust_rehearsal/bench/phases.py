"""``slurm-robust bench phases``: long evaluations, saves and a slow first step, no faults.

The no-false-alarm half of phase-aware hang detection (launcher/control/phases.py),
measured over runs too long for the test suite. Two robust runs of examples/train_gpt.py
at once on the mini-cluster, two nodes each, with the launcher's default hang settings:

- ``sections``: ``--step-time`` steps (0.5 s) with a ``--eval`` evaluation (60 s every 200
  steps) and a ``--save`` save (30 s every 500 steps) declared with ``run.section``, sized
  to last ``--minutes`` (15) without faults;
- ``compile``: a first step ``--first-step`` seconds longer (120 s, the stand-in for a
  compilation), then ``COMPILE_STEPS`` steps; it declares no phase, so it is judged by the
  start-up limit and then the single rule.

Under one limit for the whole run, each section would be a hang (the default floor is
20 s). The target: both runs complete with no incident. The report gives each run's
learned limits (state.json) and the durations the controller timed per phase; the
stopped-worker half (a hang declared within 5 s) is tests/integration/test_phase_hangs.py
and the phase-aware ``bench ettr --section``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.records import read_records
from slurm_robust.slurm import Slurm
from slurm_robust.vocabulary import RUN_STATUSES
from slurm_robust_rehearsal.bench.ettr import LONG_RUN_LR, planned_steps
from slurm_robust_rehearsal.bench.polling import wait_for
from slurm_robust_rehearsal.cluster.config import ClusterConfig

HELP = "long evaluations, saves and a slow first step with no fault: no hang may be declared"
REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "train_gpt.py"
COMPILE_STEPS = 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=15.0,
                        help="length of the sections run (default 15)")
    parser.add_argument("--step-time", type=float, default=0.5,
                        help="seconds a step takes (default 0.5)")
    parser.add_argument("--eval", default="200:60", metavar="EVERY:SECONDS",
                        help="an evaluation section (default 200:60)")
    parser.add_argument("--save", default="500:30", metavar="EVERY:SECONDS",
                        help="a save section (default 500:30)")
    parser.add_argument("--first-step", type=float, default=120.0, metavar="S",
                        help="extra seconds of the compile run's first step (default 120)")


def _section(name: str, text: str) -> str:
    every, _, seconds = text.partition(":")
    try:
        ok = int(every) > 0 and float(seconds) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(f"--{name} {text!r}: use EVERY:SECONDS, e.g. 200:60")
    return f"{name}:{every}:{seconds}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.minutes <= 0 or args.step_time <= 0 or args.first_step < 0:
        raise UsageError("--minutes and --step-time must be positive, --first-step >= 0")
    sections = [_section("eval", args.eval), _section("save", args.save)]
    cfg = ClusterConfig().with_saved_shape()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up")
    env = dict(os.environ, **cfg.env())
    stamp = int(time.time() * 1000)
    steps = planned_steps(args.minutes, args.step_time, sections)
    plans = {
        "sections": ["--steps", str(steps), "--min-step-time", str(args.step_time),
                     *[a for s in sections for a in ("--section", s)]],
        "compile": ["--steps", str(COMPILE_STEPS), "--min-step-time", str(args.step_time),
                    "--first-step-time", str(args.first_step)],
    }
    limit_min = int(args.minutes * 2 + args.first_step / 60 + 10)
    jobs: dict[str, tuple[str, Path]] = {}
    try:
        for name, train_args in plans.items():
            run_dir = cfg.shared_dir / f"bench-phases-{name}-{stamp}"
            jobs[name] = (_submit(env, run_dir, limit_min, train_args), run_dir)
        for _, run_dir in jobs.values():
            wait_for(lambda d=run_dir: run_status(str(d)).get("status") in RUN_STATUSES,
                     limit_min * 60, "the run to end", every_s=1.0)
    finally:
        for job, _ in jobs.values():
            j = slurm.job(job)
            if j is not None and not j.finished:
                slurm.cancel(job)
    runs = {name: _figures(job, run_dir) for name, (job, run_dir) in jobs.items()}
    return {"benchmark": "phases",
            "config": {"minutes": args.minutes, "step_time_s": args.step_time,
                       "sections": sections, "first_step_s": args.first_step,
                       "steps": {"sections": steps, "compile": COMPILE_STEPS},
                       "hang_settings": "the launcher's defaults"},
            "runs": runs,
            "target": {"incidents": 0,
                       "met": all(r["status"] == "completed" and r["incidents"] == 0
                                  for r in runs.values())}}


def _submit(env: dict[str, str], run_dir: Path, limit_min: int,
            train_args: list[str]) -> str:
    cli = [sys.executable, "-m", "slurm_robust.cli.main"]
    out = subprocess.run([*cli, "submit", "--nodes", "2", "--spares", "0", "--time",
                          str(limit_min), "--folder", str(run_dir), "--json", "--",
                          sys.executable, str(EXAMPLE), "--lr", str(LONG_RUN_LR),
                          *train_args], env=env, capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise SlurmRobustError(f"submit failed: {out.stderr.strip()}")
    return str(json.loads(out.stdout)["job_id"])


def _figures(job: str, run_dir: Path) -> dict[str, Any]:
    paths = RunPaths.of(run_dir)
    events = read_records(paths.events, "slurm_robust.event").records
    incidents = [e for e in events if e.get("event") == "incident"]
    steps = [e for e in events if e.get("event") == "step"]
    state = load_state(paths.state)
    times = {k: {"n": len(v), "max_s": max(v)} for k, v in state.phase_times.items() if v}
    return {"job_id": job, "run_dir": str(run_dir),
            "status": run_status(str(run_dir)).get("status"),
            "wall_s": round(steps[-1]["time"] - events[0]["time"], 1)
            if steps and events else None,
            "last_step": steps[-1].get("step") if steps else None,
            "incidents": len(incidents),
            "incident_classes": [i.get("class") for i in incidents],
            "declares_phases": state.declares_phases,
            "hang_limits_s": dict(state.hang_limits),
            "phase_times": times}
