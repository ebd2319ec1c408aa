"""Start a requeued job again at once, without tripping slurmd's credential check.

Slurm 22.05 holds a requeued batch job: when the job finishes completing (after the node
epilogs) it sets the job's BeginTime to now + the credential lifetime (``cred_expire``,
120 s by default), which also undoes a ``StartTime=now`` made while it was completing.
The hold has a reason. The requeue revoked the job's launch credential on its nodes,
and a slurmd refuses a new launch of the same job whose credential was created in the
same second as the revocation or earlier (``cred->ctime <= j->revoked`` in
slurm_cred.c). slurmctld then ends the job for good ("Killing non-startable batch
JobId=N: Job credential revoked"): a requeue turned into a FAILED job. It happens
when the epilog is quick and the job lands on a node it ran on within that second.

So the reset waits for both: the job pending again (an earlier reset is undone), and a
wall-clock second at least ``CREDENTIAL_MARGIN_S`` past the requeue's (the revocation is
stamped by slurmctld when it sends the kill, which is no later than whoever requeued
saw the requeue answered, or than EpilogSlurmctld's start; the second second absorbs a
clock step between this host and slurmctld's). Launcher jobs, whose epilogs take
seconds, never wait for the margin.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from slurm_robust.slurm.records import Job

#: Whole seconds between the requeue's second and the earliest StartTime reset.
CREDENTIAL_MARGIN_S = 2.0

#: States of a requeued job that is still on its way back to the queue.
ON_THE_WAY_BACK = frozenset({"COMPLETING", "REQUEUED", "REQUEUE_FED"})

STARTED = "StartTime reset"


class JobControl(Protocol):
    """What the reset needs of :class:`slurm_robust.slurm.Slurm`."""

    def job(self, job_id: str | int) -> Job | None: ...

    def update_job(self, job_id: str | int, **fields: str) -> None: ...


def earliest_reset(requeued_at: float) -> float:
    """The wall-clock time from which a StartTime reset cannot meet a revoked credential."""
    return math.floor(requeued_at) + CREDENTIAL_MARGIN_S


def start_requeued(slurm: JobControl, job_id: str, requeued_at: float, timeout_s: float,
                   clock: Callable[[], float] = time.monotonic,
                   wall: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep,
                   poll_s: float = 0.2) -> str:
    """Reset the requeued job's StartTime once it is pending again and the credential
    margin has passed; returns :data:`STARTED` or, when nothing was reset, why.

    ``requeued_at`` is a wall-clock time no earlier than the requeue (taken after
    ``scontrol requeue`` returned, or when EpilogSlurmctld started).
    """
    deadline = clock() + timeout_s
    while True:
        job = slurm.job(job_id)
        if job is None or job.state not in ON_THE_WAY_BACK | {"PENDING"}:
            return f"job is {job.state if job else 'gone'}; nothing to start"
        if job.state == "PENDING":
            wait = earliest_reset(requeued_at) - wall()
            if wait <= 0:
                slurm.update_job(job_id, StartTime="now")
                return STARTED
            if clock() + wait > deadline:
                return f"credential margin ends after the {timeout_s:g} s budget; " \
                       "StartTime not reset"
            sleep(wait)
            continue
        if clock() >= deadline:
            return f"job still {job.state} after {timeout_s:g} s; StartTime not reset"
        sleep(poll_s)
