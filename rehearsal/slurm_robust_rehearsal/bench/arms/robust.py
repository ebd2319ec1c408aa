"""The subject: ``slurm-robust submit --nodes N --spares 1`` and ``slurm-robust inject
kill-worker``: in-place restart from the shared-memory snapshot. In ``bench update`` it
is the hot update (``slurm-robust update --code NEW --now``); in ``bench ettr`` the
robust run on the fault schedule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher import versions as vs
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.records import read_records
from slurm_robust.slurm import Slurm
from slurm_robust.vocabulary import RUN_STATUSES
from slurm_robust_rehearsal.bench.arms.base import (
    EXAMPLE,
    EttrRun,
    RecoveryRun,
    Seconds,
    Setup,
    UpdateRun,
)
from slurm_robust_rehearsal.bench.polling import wait_for

CLI = [sys.executable, "-m", "slurm_robust.cli.main"]


class RobustLauncher:
    label = "slurm_robust"
    redone_key = "slurm_robust"
    subject = True
    optional_key: str | None = None
    update_key = "hot_update_now"

    def __init__(self, name: str) -> None:
        self.name = name

    def missing(self, setup: Setup) -> str | None:
        return None

    def fault_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        return {self.label: secs}

    def speedup_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        return {}

    def launch(self, run: RecoveryRun) -> dict[str, Any]:
        from slurm_robust_rehearsal.inject.job import inject as inject_fault

        cfg, args = run.cfg, run.args
        run_dir = str(cfg.shared_dir / f"bench-robust-{int(time.time() * 1000)}")
        t0 = time.time()
        job = submit_example(cfg.env(), args.nodes, 1, run_dir, run.train)
        try:
            wait_for(lambda: (run_status(run_dir).get("step") or 0) >= args.fault_step,
                     args.timeout, "robust run to reach the fault step")
        except SlurmRobustError as exc:
            # A job that never started says why (a drained node left the 3 + 1 short, ...).
            slurm = Slurm(cfg.env())
            j = slurm.job(job)
            if j is not None and not j.finished:
                slurm.cancel(job)  # as the peers' runs are: the next round needs the nodes
            if j is not None and j.state == "PENDING":
                raise SlurmRobustError(f"{exc}: job {job} still PENDING ({j.state_reason}); "
                                       "see `sinfo -R`") from exc
            raise
        # In this process, as the peers' kill is (`slurm-robust inject kill-worker` is the
        # same function behind a new interpreter, whose start-up would compete with the
        # restart on a small machine). The clock starts just before the kill (the record's
        # time), as the peers' does, so the agent's detection is inside the figure.
        record = inject_fault("kill-worker", job, rank=args.nodes - 1, run_dir=run_dir)
        fault_t = float(record["time"])
        status = wait_for(lambda: (s := run_status(run_dir)).get("status") in
                          RUN_STATUSES and s, args.timeout,
                          "robust run end")
        events = read_records(Path(run_dir) / "events.jsonl").records
        incident = next(e for e in events if e.get("event") == "incident")
        # The restarted generation's first step (a step in flight at the kill is not one).
        t_next = min(e["time"] for e in events
                     if e.get("event") == "step" and e["time"] > fault_t
                     and (e.get("attempt") or 0) >= (incident.get("attempt") or 0))
        return {"job_id": job, "fault_to_next_step_s": round(t_next - fault_t, 2),
                "incident_class": incident["class"], "rung": incident["rung"],
                "restore_tier": incident["restore_tier"],
                "steps_redone": incident["steps_lost"],
                "wall_s": round(time.time() - t0, 1),
                "params_sha256": status.get("params_sha256"), "run_dir": run_dir}

    def ettr(self, run: EttrRun) -> dict[str, Any]:
        """``bench ettr`` with this arm: one robust run on the fault schedule."""
        from slurm_robust_rehearsal.bench.ettr_robust import run_robust

        return run_robust(run, self.name)

    def update(self, run: UpdateRun) -> dict[str, Any]:
        """``bench update``: ``update --code NEW --now`` once the change step is done."""
        cfg, args = run.cfg, run.args
        run_dir = str(cfg.shared_dir / f"bench-update-hot-{int(time.time() * 1000)}")
        env = dict(os.environ, **cfg.env())
        t0 = time.time()
        job = submit_example(cfg.env(), args.nodes, 0, run_dir, run.train)
        wait_for(lambda: (run_status(run_dir).get("step") or 0) >= args.change_step,
                 args.timeout, "robust run to reach the change step")
        t_req = time.time()
        upd = subprocess.run([*CLI, "update", run_dir, "--code", str(run.code), "--now",
                              "--json", "-m", "bench update"], env=env, capture_output=True,
                             text=True, timeout=120)
        if upd.returncode != 0:
            raise SlurmRobustError(f"update failed: {upd.stderr.strip()}")
        resumed = wait_for(lambda: next((c for c in vs.read_changes(run_dir)
                                         if c["event"] == "resumed"), None), args.timeout,
                           "the first step on the new version")
        status = wait_for(lambda: (s := run_status(run_dir)).get("status") in
                          RUN_STATUSES and s, args.timeout,
                          "robust run end")
        return {"job_id": job, "downtime_s": round(resumed["time"] - t_req, 3),
                "controller_downtime_s": resumed["downtime_s"],
                "restart_s": resumed["restart_s"], "applied_step": resumed["applied_step"],
                "restored_step": resumed["restored_step"],
                "steps_redone": resumed["steps_redone"], "status": status.get("status"),
                "wall_s": round(time.time() - t0, 1),
                "params_sha256": status.get("params_sha256"), "run_dir": run_dir}


def submit_example(cluster_env: dict[str, str], nodes: int, spares: int, run_dir: str,
            train: list[str]) -> str:
    """``slurm-robust submit`` of the example on the mini-cluster; its job id (also the
    many-nodes rehearsal's)."""
    out = subprocess.run([*CLI, "submit", "--nodes", str(nodes), "--spares", str(spares),
                          "--time", "20", "--folder", run_dir, "--json", "--",
                          sys.executable, str(EXAMPLE), *train],
                         env=dict(os.environ, **cluster_env), capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise SlurmRobustError(f"robust submit failed: {out.stderr.strip()}")
    return str(json.loads(out.stdout)["job_id"])
