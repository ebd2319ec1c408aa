"""Reconcile and status: keep the reserve partition at its target size.

``reconcile`` takes the reserve lock, snapshots nodes and partitions, plans with the pure
:func:`~slurm_robust.reserve.plan.plan_reconcile` and applies the moves and drains; the
deep checks the plan asks for run with the lock released (each waits minutes for the
node's own slurmd, and a job-end handoff must not wait behind them), then it takes the lock
again and re-plans on a fresh snapshot. It is idempotent: a second run finds nothing to
do; two runs at once never fill twice (each re-plans under the lock from a fresh
snapshot, and a node one of them is checking is drained pending, so the other leaves it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.breaker import DrainBreaker
from slurm_robust.health.ledger_writer import SiteLedger
from slurm_robust.reserve.config import HOUR_S, ReserveConfig
from slurm_robust.reserve.executor import Executor
from slurm_robust.reserve.gate import HealthGate
from slurm_robust.reserve.history import (
    NodeEvent,
    events_from_health,
    events_from_sacctmgr,
    failure_times,
)
from slurm_robust.reserve.lock import reserve_lock
from slurm_robust.reserve.plan import (
    DeepCheck,
    NodeView,
    Snapshot,
    is_fresh,
    is_spare,
    plan_reconcile,
)
from slurm_robust.reserve.sizing import (
    FailureEstimate,
    Target,
    estimate_failure_prob,
    reserve_target,
)
from slurm_robust.reserve.verdicts import ensure_verdict_root
from slurm_robust.slurm import Slurm

log = logging.getLogger("slurm_robust.reserve")

# Deep checks, then moves: a second round of checks would mean a node went stale mid-run.
MAX_ROUNDS = 3
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"


def take_snapshot(slurm: Slurm, gate: HealthGate, cfg: ReserveConfig,
                  now: float, extra_partitions: Iterable[str] = (),
                  lemons: frozenset[str] = frozenset()) -> Snapshot:
    """Partition membership (reserve + train partitions), those nodes' views, and the
    node ledger's lemons (never admitted to the reserve)."""
    names = (cfg.partition, *cfg.train_partitions, *extra_partitions)
    parts = {p: tuple(slurm.partition_nodes(p)) for p in dict.fromkeys(names)}
    wanted = {n for members in parts.values() for n in members}
    views = {n.name: NodeView(n.name, n.idle, n.drained, n.usable, n.reason,
                              gate.last_deep_pass(n.name))
             for n in slurm.nodes(wanted)}
    return Snapshot(now, views, parts, lemons)


def pool_size(snap: Snapshot, cfg: ReserveConfig) -> int:
    """Nodes robust jobs use: train partitions plus the reserve (stable under moves)."""
    if cfg.robust_nodes is not None:
        return cfg.robust_nodes
    return len({n for p in (cfg.partition, *cfg.train_partitions)
                for n in snap.partitions.get(p, ())})


def estimate(slurm: Slurm, gate: HealthGate, cfg: ReserveConfig, nodes: Iterable[str],
             n_nodes: int, now: float) -> tuple[FailureEstimate, str]:
    """Failure probability from Slurm's node events and the health journals readable here,
    blended with the prior (which is all there is without history)."""
    since = time.strftime(_SACCT_TIME, time.localtime(now - cfg.history_h * HOUR_S))
    names = sorted(nodes)
    if not names:
        return _prior(cfg, n_nodes, now), "no nodes"
    events: list[NodeEvent] = []
    sources = []
    try:
        raw = slurm.node_events_raw(args=[f"start={since}", f"nodes={','.join(names)}"])
        events += events_from_sacctmgr(raw)
        sources.append("node events")
    except SlurmRobustError as exc:
        sources.append(f"node events unavailable ({exc})")
    journal = [e for n in names for e in events_from_health(gate.journal(n))]
    if journal:
        events += journal
        sources.append("health journals")
    # One node's records of one fault (journal + drain event) count once per window.
    times = failure_times(events, cfg.replacement_window_h * HOUR_S)
    return estimate_failure_prob(times, n_nodes, now, cfg.history_h, cfg.replacement_window_h,
                                 cfg.failure_prob_prior, cfg.prior_weight), ", ".join(sources)


def _prior(cfg: ReserveConfig, n_nodes: int, now: float) -> FailureEstimate:
    return estimate_failure_prob([], 0, now, cfg.history_h, cfg.replacement_window_h,
                                 cfg.failure_prob_prior, cfg.prior_weight)


def compute_target(slurm: Slurm, gate: HealthGate, cfg: ReserveConfig,
                   snap: Snapshot) -> dict[str, Any]:
    nodes = {n for p in (cfg.partition, *cfg.train_partitions)
             for n in snap.partitions.get(p, ())}
    n = pool_size(snap, cfg)
    if cfg.target is not None:
        est, source = _prior(cfg, n, snap.now), "fixed target; estimate not used"
    else:
        est, source = estimate(slurm, gate, cfg, nodes, n, snap.now)
    target: Target = reserve_target(n, est.p, cfg.quantile, cfg.target, cfg.min_target)
    return {"target": target, "estimate": est, "estimate_source": source}


@dataclass
class ReconcileReport:
    target: int
    spares_before: list[str]
    spares_after: list[str]
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    lock_wait_s: float = 0.0
    sizing: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reconcile(slurm: Slurm, gate: HealthGate, cfg: ReserveConfig, dry_run: bool = False,
              clock: Callable[[], float] = time.time,
              breaker: DrainBreaker | None = None,
              ledger: SiteLedger | None = None) -> ReconcileReport:
    """Bring the reserve to its target; see the module docstring. ``ledger``: the node
    ledger, which names the lemons (kept out) and records the drains and deep checks.

    Raises:
        ReserveLockTimeout: another reserve operation held the lock too long.
        SlurmCommandError: Slurm could not be read (nothing was changed then).
    """
    lemons = ledger.lemons() if ledger is not None else frozenset()
    executor = Executor(slurm, gate, cfg.log_file, "reconcile", dry_run, clock, breaker,
                        record=ledger.record if ledger is not None else None)
    checked: set[str] = set()
    outcomes: list[dict[str, Any]] = []
    waited_total = 0.0
    plan_once: tuple[dict[str, Any], int, list[str], int] | None = None
    for _ in range(MAX_ROUNDS):
        with reserve_lock(cfg.lock_file, cfg.lock_timeout_s) as waited:
            waited_total += waited
            snap = take_snapshot(slurm, gate, cfg, clock(), lemons=lemons)
            if plan_once is None:
                if not dry_run:
                    ensure_verdict_root(cfg.verdict_root)
                sizing = compute_target(slurm, gate, cfg, snap)
                plan_once = (sizing, sizing["target"].size, spares_of(snap, cfg),
                             queued_need(slurm, cfg))
            sizing, target, before, keep = plan_once
            actions = plan_reconcile(snap, cfg, target, frozenset(checked), keep)
            checks = [a for a in actions if isinstance(a, DeepCheck)]
            outcomes += executor.apply([a for a in actions if not isinstance(a, DeepCheck)])
        if not checks:
            break
        # A remote deep check waits for the node's own slurmd (up to two
        # HealthCheckIntervals and the suite): outside the lock, so a job-end handoff is
        # never kept waiting for it. The nodes checked are no spares (their pass is stale),
        # so the handoff cannot take them meanwhile; the next round re-plans under the lock
        # from a fresh snapshot.
        outcomes += executor.apply(checks)
        checked.update(a.node for a in checks)
        if dry_run:
            break
    assert plan_once is not None  # the first round always plans
    sizing, target, before, _keep = plan_once
    after = spares_of(take_snapshot(slurm, gate, cfg, clock(), lemons=lemons), cfg) \
        if outcomes else before
    return ReconcileReport(target, before, after, outcomes, round(waited_total, 3),
                           {k: v.as_dict() if hasattr(v, "as_dict") else v
                            for k, v in sizing.items()})


def queued_need(slurm: Slurm, cfg: ReserveConfig) -> int:
    """The most nodes a job queued in a train partition asks for: reconcile never borrows
    the train partitions below it (the borrowing policy, plan.borrowable)."""
    need = 0
    for job in slurm.jobs():
        parts = set(job.partition.split(","))
        if job.state == "PENDING" and parts & set(cfg.train_partitions):
            need = max(need, job.node_count)
    return need


def spares_of(snap: Snapshot, cfg: ReserveConfig) -> list[str]:
    return sorted(n for n in snap.partitions.get(cfg.partition, ())
                  if n in snap.nodes and n not in snap.lemons
                  and is_spare(snap.nodes[n], snap.now, cfg))


def status(slurm: Slurm, gate: HealthGate, cfg: ReserveConfig,
           clock: Callable[[], float] = time.time,
           ledger: SiteLedger | None = None) -> dict[str, Any]:
    """The reserve now: members, which are spares and why not, the target and its basis."""
    snap = take_snapshot(slurm, gate, cfg, clock(),
                         lemons=ledger.lemons() if ledger is not None else frozenset())
    sizing = compute_target(slurm, gate, cfg, snap)
    members = []
    for name in snap.partitions.get(cfg.partition, ()):
        v = snap.nodes.get(name)
        if v is None:
            continue
        age = None if v.last_deep_pass is None else round((snap.now - v.last_deep_pass) / 3600, 2)
        lemon = name in snap.lemons
        members.append({"node": name, "spare": is_spare(v, snap.now, cfg) and not lemon,
                        "lemon": lemon, "idle": v.idle,
                        "drained": v.drained, "usable": v.usable, "reason": v.reason,
                        "deep_pass_age_h": age, "fresh": is_fresh(v, snap.now, cfg)})
    spare_count = sum(1 for m in members if m["spare"])
    return {"partition": cfg.partition, "train_partitions": list(cfg.train_partitions),
            "target": sizing["target"].size, "spares": spare_count,
            "deficit": max(sizing["target"].size - spare_count, 0), "members": members,
            "sizing": {"target": sizing["target"].as_dict(),
                       "estimate": sizing["estimate"].as_dict(),
                       "estimate_source": sizing["estimate_source"]},
            "freshness_h": cfg.freshness_h}
