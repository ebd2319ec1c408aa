"""Who an agent is, from Slurm's task environment (shared by the node and control planes)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """One Slurm task of a robust job step: its index (SLURM_PROCID), node and job.

    ``step_key`` is job id, step id and Slurm restart count: it tells this allocation's
    controller from a stale one of an earlier allocation of the same (requeued) job.
    """

    index: int
    node: str
    job_id: str
    step_key: str
    restart_count: int

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Identity:
        e = os.environ if env is None else env
        job = e.get("SLURM_JOB_ID") or e.get("SLURM_JOBID") or "local"
        restart = int(e.get("SLURM_RESTART_COUNT") or 0)
        step = e.get("SLURM_STEP_ID") or e.get("SLURM_STEPID") or "0"
        return cls(index=int(e.get("SLURM_PROCID") or 0),
                   node=e.get("SLURMD_NODENAME") or socket.gethostname(),
                   job_id=job, step_key=f"{job}.{step}.{restart}", restart_count=restart)
