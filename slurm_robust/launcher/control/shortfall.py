"""Can a requeue be served? The partition's nodes off the exclusion, plus the reserve's.

Why: a requeued job keeps its node count and gets ``ExcNodeList`` = the blamed nodes. When
the partition's usable nodes outside that list, plus the spares EpilogSlurmctld can hand
over from the reserve (at most one per blamed node), are fewer than the job asks for,
Slurm keeps the job pending until an admin returns nodes: the run stalls, and nothing of
it is left running to say so. The controller therefore counts before it requeues and
applies the run's policy (``--on-shortfall``):

- ``shrink`` (default): when what is left still holds the training world (``nodes``),
  requeue on that many nodes: the job gives up parked spares, never ranks. Else stop.
- ``stop``: stop the run with a verdict naming the shortfall (resubmit when nodes return).
- ``wait``: requeue anyway and pend until nodes return; ``status`` shows
  "pending: reserve shortfall (needs N, has M)".

The count is an upper bound where it cannot be exact: a busy node of the partition counts
(it frees up), and idle reserve nodes count without their deep-check freshness, which
only the handoff (SlurmUser, with the check history) can judge. A count Slurm cannot
give (slurmctld away) never blocks the requeue.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.launcher.paths import load_site
from slurm_robust.reserve.config import reserve_config
from slurm_robust.slurm import Slurm
from slurm_robust.slurm.runner import RetryPolicy

#: One try, a short timeout: see job_capacity.
COUNT_POLICY = RetryPolicy(attempts=1, timeout_s=8.0)

log = logging.getLogger("slurm_robust.launcher.control.shortfall")


class ShortfallPolicy(enum.StrEnum):
    SHRINK = "shrink"
    STOP = "stop"
    WAIT = "wait"


class Choice(enum.StrEnum):
    REQUEUE = "requeue"   # as asked (enough nodes, or the policy is to wait)
    SHRINK = "shrink"     # requeue on fewer nodes (fewer parked spares)
    STOP = "stop"         # do not requeue: stop the run with a verdict


class CapacityRecord(TypedDict):
    """A :class:`Capacity` in an incident's evidence."""

    partition: str
    needs: int
    has: int
    reserve: int


@dataclass(frozen=True)
class Capacity:
    """What a requeued job could get, counted before the requeue."""

    partition: str
    needs: int      # nodes the job asks for
    has: int        # usable partition nodes off the exclusion + reserve nodes it may get
    reserve: int    # of ``has``, from the reserve

    @property
    def short(self) -> bool:
        return self.has < self.needs

    def describe(self) -> str:
        return f"reserve shortfall (needs {self.needs}, has {self.has})"

    def to_dict(self) -> CapacityRecord:
        return {"partition": self.partition, "needs": self.needs, "has": self.has,
                "reserve": self.reserve}


@dataclass(frozen=True)
class RequeuePlan:
    choice: Choice
    nodes: int | None = None   # the node count to requeue with (SHRINK)
    reason: str = ""


def plan_requeue(cap: Capacity | None, policy: ShortfallPolicy, min_nodes: int) -> RequeuePlan:
    """The policy applied to a count (pure). ``min_nodes``: the training world's nodes."""
    if cap is None or not cap.short:
        return RequeuePlan(Choice.REQUEUE)
    what = f"{cap.describe()} in partition {cap.partition!r} after excluding blamed nodes"
    if policy is ShortfallPolicy.WAIT:
        return RequeuePlan(Choice.REQUEUE, reason=f"pending: {what}")
    if policy is ShortfallPolicy.SHRINK and cap.has >= min_nodes:
        return RequeuePlan(Choice.SHRINK, cap.has,
                           f"{what}: requeued on {cap.has} node(s), "
                           f"{cap.has - min_nodes} spare(s)")
    tail = (f"the training needs {min_nodes}" if policy is ShortfallPolicy.SHRINK
            else "--on-shortfall stop")
    return RequeuePlan(Choice.STOP, reason=f"{what} ({tail}); stopped instead of pending; "
                                           "resubmit when nodes return")


class ShortfallEvidence(CapacityRecord):
    """An incident's ``evidence.shortfall``: the count and the plan taken."""

    choice: str
    nodes: int | None
    why: str


def evidence(cap: Capacity, plan: RequeuePlan) -> ShortfallEvidence:
    """The incident's ``evidence.shortfall`` (docs/SCHEMAS.md); ``status`` reads it."""
    return {**cap.to_dict(), "choice": plan.choice.value, "nodes": plan.nodes,
            "why": plan.reason}


def reserve_partition(site_config: str | None) -> str | None:
    """The site's reserve partition; None without a readable site config."""
    try:
        return reserve_config(load_site(site_config)).partition
    except (UsageError, OSError):
        return None


def job_capacity(job_id: str, exclude: Sequence[str], reserve_partition: str | None,
                 slurm: Slurm | None = None,
                 env: Mapping[str, str] | None = None) -> Capacity | None:
    """Count what a requeue of ``job_id`` off ``exclude`` could get; None when Slurm
    cannot tell (the requeue then goes ahead as before).

    Fast on purpose: when a node died, Slurm marks it down after about 2 x SlurmdTimeout
    and then fails (and requeues) the job itself, killing this very process before it
    has requeued with the exclusion. So the job's partition and size come from its own
    environment (squeue only outside a job), the nodes from ONE ``sinfo``, one try, a
    short timeout; the requeue itself waits out a slurmctld outage.
    """
    e = os.environ if env is None else env
    slurm = slurm or Slurm(policy=COUNT_POLICY)
    try:
        size = _job_size(job_id, e, slurm)
        if size is None:
            return None
        partition, needs = size
        excluded = set(exclude)
        nodes = [n for n in slurm.nodes() if n.name not in excluded]
        has = sum(1 for n in nodes if partition in n.partitions and n.usable)
        reserve = 0
        if reserve_partition and reserve_partition != partition:
            idle = sum(1 for n in nodes if reserve_partition in n.partitions and n.idle
                       and partition not in n.partitions)
            # The handoff moves at most one spare per node the job lost.
            reserve = min(idle, len(excluded))
        return Capacity(partition, needs, has + reserve, reserve)
    except (SlurmRobustError, OSError) as exc:
        log.warning("cannot count the nodes a requeue of %s would get: %s", job_id, exc)
        return None


def _job_size(job_id: str, e: Mapping[str, str], slurm: Slurm) -> tuple[str, int] | None:
    """The job's partition and node count: from its own environment, else squeue (None:
    Slurm does not know the job)."""
    partition = (e.get("SLURM_JOB_PARTITION") or "").split(",")[0]
    needs_text = e.get("SLURM_JOB_NUM_NODES") or e.get("SLURM_NNODES") or ""
    if partition and needs_text.isdigit():
        return partition, int(needs_text)
    job = slurm.job(job_id)
    if job is None or not job.partition:
        return None
    return job.partition.split(",")[0], job.node_count
