"""The robust arm's run of ``bench ettr``: one ``slurm-robust submit`` of the example on
the fault schedule (``slurm-robust inject``), measured through the post-mortem analysis
(bench/ettr.py says what and why)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.slurm import Slurm
from slurm_robust.vocabulary import RUN_STATUSES
from slurm_robust_rehearsal.bench.arms.base import EXAMPLE, EttrRun
from slurm_robust_rehearsal.bench.ettr_common import (
    LONG_RUN_LR,
    TARGET_ETTR,
    TARGET_ETTR_PHASES,
    TARGET_FAULT_EVERY_S,
    TARGET_MINUTES,
    downtime_split,
    phase_figures,
    planned_steps,
    schedule,
    section_args,
)
from slurm_robust_rehearsal.bench.polling import wait_for
from slurm_robust_rehearsal.cluster.config import ClusterConfig


def run_robust(one: EttrRun, arm: str) -> dict[str, Any]:
    """The robust arm's run on the schedule and its report (``"arm"``: ``arm``)."""
    args, faults = one.args, one.faults
    cfg = ClusterConfig().with_saved_shape()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up")
    run_dir = cfg.shared_dir / f"bench-ettr-{int(time.time() * 1000)}"
    steps = planned_steps(args.minutes, args.step_time, args.section)
    env = dict(os.environ, **cfg.env())
    cli = [sys.executable, "-m", "slurm_robust.cli.main"]
    limit_min = int(args.minutes * 3 + 10)
    out = subprocess.run([*cli, "submit", "--nodes", str(args.nodes), "--spares",
                          str(args.spares), "--time", str(limit_min), "--folder", str(run_dir),
                          "--max-restarts", "1000", "--hang-timeout", str(args.hang_timeout),
                          "--no-fail-slow", "--json", "--", sys.executable, str(EXAMPLE),
                          "--steps", str(steps), "--min-step-time", str(args.step_time),
                          "--lr", str(LONG_RUN_LR), *section_args(args.section)],
                         env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise SlurmRobustError(f"submit failed: {out.stderr.strip()}")
    job = json.loads(out.stdout)["job_id"]
    try:
        injected = _drive(cli, env, job, run_dir, args, faults, one.first_step)
        _wait_end(run_dir, limit_min * 60)
    finally:
        j = slurm.job(job)
        if j is not None and not j.finished:
            slurm.cancel(job)
    return _report(run_dir, args, faults, injected, job, one.peers, arm)


def _drive(cli: list[str], env: dict[str, str], job: str, run_dir: Path,
           args: argparse.Namespace, faults: list[str],
           first_step: threading.Event | None = None) -> list[dict[str, Any]]:
    first = wait_for(lambda: run_dir.is_dir() and (s := run_status(str(run_dir))).get("step")
                     and s, 600, "the first step", every_s=0.5)
    if first_step is not None:
        first_step.set()
    t0 = float(first["last_step_time"])
    injected = []
    for at, fault in schedule(t0, args.minutes, args.fault_every, faults):
        while time.time() < at:
            if run_status(str(run_dir)).get("status") != "running":
                return injected
            time.sleep(min(1.0, max(at - time.time(), 0.0)))
        res = subprocess.run([*cli, "inject", fault, "--job", job, "--run-dir",
                              str(run_dir), "--json"], env=env, capture_output=True,
                             text=True, timeout=120)
        injected.append({"at_s": round(at - t0, 1), "fault": fault,
                         "ok": res.returncode == 0,
                         **({} if res.returncode == 0 else {"error": res.stderr.strip()[-300:]})})
    return injected


def _wait_end(run_dir: Path, timeout_s: float) -> None:
    wait_for(lambda: run_status(str(run_dir)).get("status") in RUN_STATUSES,
             timeout_s, "the run to end", every_s=0.5)


def _report(run_dir: Path, args: argparse.Namespace, faults: list[str],
            injected: list[dict[str, Any]], job: str, peers: dict[str, str],
            arm: str) -> dict[str, Any]:
    from slurm_robust.analysis.pipeline import analyse, load_inputs

    an = analyse(load_inputs([str(run_dir)]), window_s=3600.0)
    head = an.headline()
    last_hour = (float(an.sliding["window_ettr"].iloc[-1]) if len(an.sliding)
                 else float("nan"))
    split = downtime_split(an.incidents)
    wall = float(an.per_run["wall_s"].sum())
    steps = an.steps
    # The first step record of the first attempt began when start-up ended.
    startup = (float(steps["time"].iloc[0] - steps["step_time_s"].iloc[0]
                     - an.spans["start"].min()) if len(steps) else float("nan"))
    at_scale = args.minutes >= TARGET_MINUTES and args.fault_every <= TARGET_FAULT_EVERY_S
    ettr = head["ettr"]
    target = TARGET_ETTR_PHASES if args.section else TARGET_ETTR
    return {
        "benchmark": "ettr", "arm": arm, "job_id": job, "run_dir": str(run_dir),
        "status": run_status(str(run_dir)).get("status"),
        "config": {"minutes": args.minutes, "fault_every_s": args.fault_every,
                   "faults": faults, "nodes": args.nodes, "spares": args.spares,
                   "step_time_s": args.step_time, "lr": LONG_RUN_LR,
                   "sections": args.section},
        "phases": phase_figures(run_dir, an.incidents),
        "injected": injected,
        "incidents": head["incidents"], "by_class": head["by_class"],
        "by_rung": head["by_rung"],
        "wall_s": round(wall, 1),
        "ettr_cumulative": ettr,
        "ettr_last_hour": last_hour,
        "downtime_s": split,
        "startup_s": round(startup, 2),
        "unaccounted_s": round(wall * (1 - ettr) - sum(split.values()) - startup, 2)
        if ettr is not None else None,
        "steps_redone": head["steps_redone"],
        "peers": peers,
        "target": {"ettr_min": target, "at_target_scale": at_scale,
                   "target_scale": f"{TARGET_MINUTES:g} min, a fault every "
                                   f"{TARGET_FAULT_EVERY_S:g} s",
                   "met": bool(ettr is not None and ettr >= target and at_scale)},
    }
