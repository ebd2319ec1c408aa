"""The torchrun + DCP peer of ``bench ettr``: the same training and fault schedule.

What a user without slurm_robust runs for in-job restarts: ``sbatch --requeue`` with one
``torchrun --max-restarts`` agent per node (c10d rendezvous), the example saving with DCP
``async_save`` every ``SAVE_EVERY`` steps and reloading the newest one after a restart.
The faults are the same real signals as ``slurm-robust inject`` sends, aimed at the
worker of the last rank (never the batch node's):

- kill-worker: SIGKILL; torchrun restarts every worker, which reload the DCP checkpoint;
- nan: SIGUSR1, the example's poison handler (slurm_robust.train works standalone too):
  the next step's loss is NaN, the example's own check exits, torchrun restarts;
- kill-node: the node's slurmd and the job's processes on it (inject.job.kill_node);
  Slurm marks the node down and, the job being ``--requeue``, requeues it after its hold;
- stop-worker: SIGSTOP; torchrun has no hang detection, so the other ranks wait in their
  collective until the process group's timeout.

ETTR as for the robust run: productive step time over wall time, start-up included. The
productive time is the final step count times the median step duration (the padded
``--step-time``) plus the declared sections' seconds per step (``--section``: the robust
run counts them inside its steps); the wall time runs from the job's start to its last
step, or to the cap (``--minutes`` plus ``CAP_EXTRA_S``) when it has not finished by then.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.slurm import Slurm
from slurm_robust.stacks import procfs
from slurm_robust_rehearsal.bench.arms.base import EXAMPLE, EttrRun
from slurm_robust_rehearsal.bench.arms.peers import find_worker, torchrun_script
from slurm_robust_rehearsal.bench.arms.peers import steps as progress_steps
from slurm_robust_rehearsal.bench.ettr_common import (
    LONG_RUN_LR,
    TARGET_ETTR,
    TARGET_FAULT_EVERY_S,
    TARGET_MINUTES,
    planned_steps,
    schedule,
    section_args,
    section_s_per_step,
)
from slurm_robust_rehearsal.bench.polling import wait_for
from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.inject.job import kill_node

SAVE_EVERY = 10
MAX_RESTARTS = 1000
#: How long past the fault-free length the peer may run before it is stopped and measured.
CAP_EXTRA_S = 300.0


def run_peer(args: argparse.Namespace, faults: list[str], lr: float,
             schedule: Any, steps: int, extra: list[str],
             section_s: float = 0.0) -> dict[str, Any]:
    """One peer run of ``steps`` steps under ``schedule(t0, minutes, every_s, faults)``;
    its figures. ``extra``: more arguments for the example (the bench's sections);
    ``section_s``: their seconds per step, counted as productive (see figures)."""
    cfg = ClusterConfig().with_saved_shape()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up")
    run_dir = cfg.shared_dir / f"bench-ettr-torchrun-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True)
    progress, marker = run_dir / "progress.txt", str(run_dir / "ckpt")
    # Whole nodes, as a real job gets them; with --arm both it also keeps the peer's
    # kill-node off the robust run's nodes (the mini-cluster otherwise shares them).
    job = slurm.sbatch(["-N", str(args.nodes), "--ntasks-per-node=1", "-p", "train",
                        "--exclusive", "--requeue", "-t", str(int(args.minutes * 3 + 10)),
                        "-J", "bench-ettr-torchrun", "-o", str(run_dir / "slurm-%j.out")],
                       script=_script(args, steps, lr, progress, marker, extra))
    injected: list[dict[str, Any]] = []
    try:
        started = wait_for(lambda: (j := slurm.job(job)) is not None and j.running
                           and time.time(), 600, "the peer job to start", every_s=0.2)
        first = wait_for(lambda: progress_steps(progress)[:1], 600,
                         "the peer's first step", every_s=0.5)
        t0 = first[0][1]
        cap = t0 + args.minutes * 60 + CAP_EXTRA_S
        for at, fault in schedule(t0, args.minutes, args.fault_every, faults):
            while time.time() < at and not _done(slurm, job, progress, steps):
                time.sleep(min(1.0, max(at - time.time(), 0.0)))
            if _done(slurm, job, progress, steps):
                break
            injected.append(_inject(fault, job, marker, args.nodes, at - t0,
                                    str(cfg.root)))
        while time.time() < cap and not _done(slurm, job, progress, steps):
            time.sleep(1.0)
        ended_at = time.time()
    finally:
        _release(job, marker, args.nodes)
        j = slurm.job(job)
        if j is not None and not j.finished:
            slurm.cancel(job)
    return figures(progress_steps(progress), steps, float(started), ended_at,
                   injected, job, run_dir, section_s)


def figures(lines: list[tuple[int, float]], steps: int, started: float, ended_at: float,
            injected: list[dict[str, Any]], job: str, run_dir: Path,
            section_s: float = 0.0) -> dict[str, Any]:
    """The peer's ETTR and per-fault figures from its progress lines ``(step, time)``;
    ``section_s``: the sections' productive seconds per step (ettr.section_s_per_step)."""
    done = max((s for s, _ in lines), default=0)
    durations = [b[1] - a[1] for a, b in zip(lines, lines[1:], strict=False)
                 if b[0] == a[0] + 1 and b[1] > a[1]]
    step_s = statistics.median(durations) if durations else float("nan")
    completed = done >= steps
    end = max(t for _, t in lines) if completed and lines else ended_at
    wall = end - started
    per_fault = []
    for f in injected:
        # The restart is the first break after the fault: a step number that does not
        # go up by one, or a gap of over 3 steps. (A NaN's poison lands after the step in
        # flight, so the next step line can still precede the restart.)
        t = f["time"]
        nxt = before = None
        # A fault that was not injected has no restart of its own (the next break is a
        # later fault's): no figures.
        pairs = zip(lines, lines[1:], strict=False) if f.get("ok", True) else ()
        for a, b in pairs:
            if b[1] > t and (b[0] != a[0] + 1 or b[1] - a[1] > 3 * step_s):
                before, nxt = a[0], b
                break
        per_fault.append({**{k: f[k] for k in ("at_s", "fault", "ok") if k in f},
                          "fault_to_next_step_s": None if nxt is None
                          else round(nxt[1] - t, 2),
                          "steps_redone": None if nxt is None or before is None
                          else before - (nxt[0] - 1)})
    return {"job_id": job, "run_dir": str(run_dir), "completed": completed,
            "steps_done": done, "steps_planned": steps,
            "median_step_s": round(step_s, 3), "wall_s": round(wall, 1),
            "ettr_cumulative": round(done * (step_s + section_s) / wall, 4)
            if wall > 0 else None,
            "stopped_at_cap": not completed,
            "faults": per_fault, "injected": injected}


def _script(args: argparse.Namespace, steps: int, lr: float, progress: Path,
            marker: str, extra: list[str]) -> str:
    port = 41000 + os.getpid() % 1000  # clear of the launcher's and bench recovery's
    worker = [str(EXAMPLE), "--steps", str(steps), "--min-step-time",
              str(args.step_time), "--lr", str(lr), "--save-every", str(SAVE_EVERY),
              "--ckpt-dir", marker, "--progress-file", str(progress),
              "--ckpt-format", "dcp_async", *extra]
    return torchrun_script(args.nodes, MAX_RESTARTS, port, "ettr", worker)


def _done(slurm: Slurm, job: str, progress: Path, steps: int) -> bool:
    j = slurm.job(job)
    return (j is not None and j.finished) or \
        max((s for s, _ in progress_steps(progress)), default=0) >= steps


def _inject(fault: str, job: str, marker: str, nodes: int, at_s: float,
            cluster_dir: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"at_s": round(at_s, 1), "fault": fault, "time": time.time()}
    try:
        pid = find_worker(marker, str(nodes - 1))
        node = procfs.environ_value(pid, "SLURMD_NODENAME")
        rec.update(pid=pid, node=node)
        if fault == "kill-worker":
            os.kill(pid, signal.SIGKILL)
        elif fault == "nan":
            os.kill(pid, signal.SIGUSR1)
        elif fault == "stop-worker":
            os.kill(pid, signal.SIGSTOP)
        elif fault == "kill-node":
            if node is None:
                raise SlurmRobustError(f"worker {pid} has no SLURMD_NODENAME")
            # The cluster's root from its config: this process need not have run
            # `cluster env` (a 30-minute peer run lost its kill-node to that).
            kill_node(job, node, cluster_dir)
        rec["ok"] = True
    except (OSError, SlurmRobustError) as exc:
        rec.update(ok=False, error=str(exc)[-300:])
    return rec


def _release(job: str, marker: str, nodes: int) -> None:
    """Let a stopped worker go (SIGCONT) so that cancelling the job can end it."""
    for rank in range(nodes):
        try:
            os.kill(find_worker(marker, str(rank)), signal.SIGCONT)
        except (OSError, SlurmRobustError):
            pass


def report(one: EttrRun, label: str) -> dict[str, Any]:
    """The peer's run on the schedule and its report, its ``"arm"``: ``label``."""
    args, faults = one.args, one.faults
    out = run_peer(args, faults, LONG_RUN_LR, schedule,
                   planned_steps(args.minutes, args.step_time, args.section),
                   section_args(args.section), section_s_per_step(args.section))
    at_scale = args.minutes >= TARGET_MINUTES and args.fault_every <= TARGET_FAULT_EVERY_S
    return {"benchmark": "ettr", "arm": label,
            "config": {"minutes": args.minutes, "fault_every_s": args.fault_every,
                       "faults": faults, "nodes": args.nodes,
                       "step_time_s": args.step_time, "lr": LONG_RUN_LR,
                       "sections": args.section},
            **out,
            "target": {"ettr_min": TARGET_ETTR, "at_target_scale": at_scale,
                       "note": "the target is slurm_robust's; this arm is its peer"}}
