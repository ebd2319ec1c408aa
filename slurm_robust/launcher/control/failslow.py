"""Fail-slow detection in the controller: per-rank busy times in, a node eviction out.

ByteRobust (the paper's fail-slow detection, summarized in docs/ARCHITECTURE.md)
aggregates every 10 s, flags the group with the
most slow ranks, and evicts the group flagged most over 5 rounds. The vote itself is
:mod:`slurm_robust.stacks.failslow`; this module feeds it what the launcher knows.

Input: the ``busy_s`` of each rank's step progress line (``with run.busy():`` in
slurm_robust.train). Step-end times would not do: with a synchronous gradient
collective every rank ends a step together, the fast ones waiting inside the collective
for the slow one; only the time outside the collective tells them apart.

The launcher runs pure data parallelism (``dp = world size``, ``workers_per_node``
ranks per node), so the group of one slow rank is the rank itself and the eviction
names its node. The decision becomes an ``implicit``/``fail_slow`` incident that goes
through the recovery ladder like a node fault: the spare rung when a spare is parked,
else a requeue that excludes the node. A new monitor starts with every generation (the
ranks' nodes changed, and the old timings describe the old group).
"""

from __future__ import annotations

import math

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.events import new_incident
from slurm_robust.launcher.enums import IncidentClass
from slurm_robust.launcher.messages import Incident
from slurm_robust.layout import ParallelLayout
from slurm_robust.stacks.failslow import FailSlowDecision, FailSlowMonitor

CLASS = IncidentClass.MFU_DECLINE
CATEGORY = "implicit"


def new_monitor(cfg: RunConfig, rank_nodes: list[str]) -> FailSlowMonitor | None:
    """A fresh monitor for a generation whose rank ``r`` runs on ``rank_nodes[r]``;
    None when fail-slow detection is off or there are too few ranks to compare."""
    if not cfg.fail_slow or len(rank_nodes) < 2:
        return None
    layout = ParallelLayout(dp=len(rank_nodes), node_map=dict(enumerate(rank_nodes)))
    return FailSlowMonitor(layout, cfg.fail_slow_options())


def busy_of(value: object) -> float | None:
    """A step item's ``busy_s`` as seconds, or None when absent or not a sane number (the
    line comes from the training script; a bad value must not break the controller)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def incident_of(decision: FailSlowDecision, incident_id: str, last_step: int | None,
                now: float, interval_s: float) -> Incident:
    """The incident for a decision: detected and localized now (the vote names the
    group); the fault time is estimated as the start of the first round that flagged it."""
    key = decision.eviction.key
    flagged = [r.time for r in decision.rounds if r.flagged is not None
               and r.flagged.key == key]
    fault_time = min(flagged) - interval_s if flagged else None
    incident = new_incident(incident_id, CLASS, CATEGORY, now, fault_time=fault_time,
                            nodes=list(decision.eviction.nodes),
                            ranks=list(decision.eviction.ranks), last_step=last_step,
                            evidence=decision.evidence())
    incident.localized_at = now
    return incident
