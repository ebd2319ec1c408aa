"""The plain-Slurm peer: ``sbatch --requeue``; ``srun --kill-on-bad-exit`` runs the example
standalone, which ``torch.save``s every ``--save-every`` steps; when the step fails, the
batch script requeues its own job (``scontrol requeue``), as users of plain Slurm do, and
the requeued job reloads the last ``torch.save``. Its wait includes Slurm's hold of a
requeued job (BeginTime = cred_expire: 20 s on the mini-cluster, 120 s by default), so it
also reports the run with Slurm's default hold, computed from the measured one.

In ``bench update`` it is the resubmission: what a user does without a hot update."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust_rehearsal.bench.arms.base import (
    EXAMPLE,
    RecoveryRun,
    Seconds,
    UpdateRun,
)
from slurm_robust_rehearsal.bench.arms.peers import (
    RDZV_HOST,
    PeerBase,
    first_after,
    max_step,
    printed_sha,
)
from slurm_robust_rehearsal.bench.polling import wait_for

DEFAULT_CRED_EXPIRE_S = 120  # slurm.conf AuthInfo cred_expire when unset


def stock_hold(secs: Seconds, hold: int | None) -> Seconds:
    """The same measured seconds under Slurm's default hold instead of the cluster's."""
    return [p + DEFAULT_CRED_EXPIRE_S - (hold or 0) for p in secs] if secs is not None \
        else None


class PlainRequeue(PeerBase):
    label = "plain_slurm_requeue_torch_save"
    update_key = "resubmit"
    port_offset = 0

    def fault_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        return {f"plain_requeue_hold_{hold}s_measured": secs,
                f"plain_requeue_hold_{DEFAULT_CRED_EXPIRE_S}s_computed": stock_hold(secs, hold)}

    def speedup_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        return {"vs_plain_mini_cluster_hold": secs,
                "vs_plain_default_hold_computed": stock_hold(secs, hold)}

    def script(self, run: RecoveryRun, port: int, worker: list[str]) -> str:
        task = ('RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 '
                'exec "$0" "$@"')
        return "\n".join([
            "#!/bin/sh",
            # The first node's address: 127.0.0.1 reaches only the node itself when each
            # node has its own network namespace (the mini-cluster's default).
            RDZV_HOST,
            f'export MASTER_ADDR="$RDZV_HOST" MASTER_PORT={port}',
            f"srun --kill-on-bad-exit=1 sh -c {shlex.quote(task)} "
            + " ".join(shlex.quote(w) for w in worker),
            # What a plain-Slurm user does: a failed step requeues the job.
            'if [ $? -ne 0 ]; then scontrol requeue "$SLURM_JOB_ID"; sleep 60; fi',
        ]) + "\n"

    def update(self, run: UpdateRun) -> dict[str, Any]:
        """``bench update``: the job (plain ``sbatch``, the example standalone,
        ``torch.save`` every ``--save-every`` steps) cancelled at the change step and the
        new version submitted, which reloads the newest ``torch.save``."""
        slurm, args, train, code = run.slurm, run.args, run.train, run.code
        run_dir = run.cfg.shared_dir / f"bench-update-resubmit-{int(time.time() * 1000)}"
        run_dir.mkdir(parents=True)
        progress = run_dir / "progress.txt"
        ckpt = run_dir / "ckpt"
        port = 41000 + os.getpid() % 1000

        def script(path: Path) -> str:
            worker = [sys.executable, str(path), *train, "--save-every",
                      str(args.save_every), "--ckpt-dir", str(ckpt), "--progress-file",
                      str(progress)]
            task = 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 exec "$0" "$@"'
            return "\n".join(["#!/bin/sh", RDZV_HOST,
                              f'export MASTER_ADDR="$RDZV_HOST" MASTER_PORT={port}',
                              f"srun --kill-on-bad-exit=1 sh -c {shlex.quote(task)} "
                              + " ".join(shlex.quote(w) for w in worker)]) + "\n"

        def submit(path: Path, name: str) -> str:
            return str(slurm.sbatch(["-N", str(args.nodes), "--ntasks-per-node=1", "-p",
                                     "train", "-J", name, "-o",
                                     str(run_dir / "slurm-%j.out")], script=script(path)))

        t0 = time.time()
        job = submit(EXAMPLE, "bench-update-old")
        jobs = [job]
        try:
            wait_for(lambda: max_step(progress) >= args.change_step, args.timeout,
                     "the plain run to reach the change step")
            t_req = time.time()
            last = max_step(progress)
            slurm.cancel(job)
            wait_for(lambda: (j := slurm.job(job)) is None or j.finished, args.timeout,
                     "the cancelled job to end")
            # The cancelled job may finish a step after the request: only lines written
            # after it ended count (the resubmitted job's).
            t_sub = time.time()
            job2 = submit(code / EXAMPLE.name, "bench-update-new")
            jobs.append(job2)
            nxt = wait_for(lambda: first_after(progress, t_sub), args.timeout,
                           "the resubmitted run's first step")
            wait_for(lambda: (j := slurm.job(job2)) is not None and j.finished, args.timeout,
                     "the resubmitted run to end")
        finally:
            for j in jobs:
                rec = slurm.job(j)
                if rec is not None and not rec.finished:
                    slurm.cancel(j)
        sha = printed_sha(run_dir, job2)
        step, t_next = nxt
        return {"job_ids": jobs, "downtime_s": round(t_next - t_req, 3),
                "last_step_before_change": last, "resumed_at_step": step - 1,
                "steps_redone": last - (step - 1), "wall_s": round(time.time() - t0, 1),
                "params_sha256": sha, "run_dir": str(run_dir)}
