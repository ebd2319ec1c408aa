"""Deciding what the reserve should do: pure functions from a snapshot to actions.

Nothing here talks to Slurm or reads a file, so every decision is testable from a
snapshot: :mod:`.executor` applies the actions and logs them. Node lifecycle in the reserve::

    train (idle, fresh deep pass) --fill--> STANDBY --handoff--> PROMOTED (job's partition)
    STANDBY --surplus / drained / stale--> train (home partition)

A spare is a member of the reserve partition that is idle, not drained, passed the
deep suite within ``freshness_h``, and is not a lemon (health/lemons.py: blamed by too
many distinct jobs). Drained nodes and lemons never enter; a member that becomes drained,
goes down, becomes a lemon, or whose pass goes stale (and cannot be re-checked) is
returned home.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurm_robust.health.drain import ReasonKind, drain_reason
from slurm_robust.reserve.config import HOUR_S, ReserveConfig
from slurm_robust.reserve.ledger import JobLedger
from slurm_robust.reserve.verdicts import Verdict

OUR_PREFIX = "slurm_robust:"


@dataclass(frozen=True)
class NodeView:
    """What the planner knows about one node."""

    name: str
    idle: bool
    drained: bool
    usable: bool
    reason: str = ""
    last_deep_pass: float | None = None


@dataclass(frozen=True)
class Snapshot:
    """Nodes and partition membership at one instant, and the lemons (never spares)."""

    now: float
    nodes: Mapping[str, NodeView]
    partitions: Mapping[str, tuple[str, ...]]
    lemons: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Move:
    """Add ``node`` to ``dst`` and remove it from every partition in ``src``."""

    node: str
    src: tuple[str, ...]
    dst: str
    why: str
    kind: str = "move"


@dataclass(frozen=True)
class DeepCheck:
    """Run the deep suite on ``node`` (a stale spare, or a candidate to fill with)."""

    node: str
    why: str
    kind: str = "deep_check"


@dataclass(frozen=True)
class Drain:
    """Drain ``node`` with ``reason`` (already prefixed ``slurm_robust:``)."""

    node: str
    reason: str
    why: str
    job_id: str | None = None
    kind: str = "drain"
    #: Drain a DOWN node too (a job's suspect): ReturnToService must not bring it back.
    down_too: bool = False


@dataclass(frozen=True)
class Note:
    """A decision not to act, kept in the log (e.g. an admin's drain reason was kept)."""

    node: str
    why: str
    job_id: str | None = None
    kind: str = "note"


Action = Move | DeepCheck | Drain | Note


def is_fresh(view: NodeView, now: float, cfg: ReserveConfig) -> bool:
    return (view.last_deep_pass is not None
            and 0 <= now - view.last_deep_pass <= cfg.freshness_h * HOUR_S)


def is_spare(view: NodeView, now: float, cfg: ReserveConfig) -> bool:
    """Idle, not drained, usable, and a deep pass within the freshness window."""
    return view.idle and view.usable and not view.drained and is_fresh(view, now, cfg)


def spares(snap: Snapshot, cfg: ReserveConfig) -> list[str]:
    """Reserve members that are spares now, freshest first (handed over first)."""
    members = [snap.nodes[n] for n in snap.partitions.get(cfg.partition, ()) if n in snap.nodes]
    ok = [v for v in members if is_spare(v, snap.now, cfg) and v.name not in snap.lemons]
    return [v.name for v in sorted(ok, key=lambda v: (-(v.last_deep_pass or 0.0), v.name))]


def _fill_candidates(snap: Snapshot, cfg: ReserveConfig) -> list[NodeView]:
    members = set(snap.partitions.get(cfg.partition, ()))
    names: set[str] = set()
    for part in cfg.train_partitions:
        names.update(snap.partitions.get(part, ()))
    views = [snap.nodes[n] for n in sorted(names - members) if n in snap.nodes]
    idle = [v for v in views if v.idle and v.usable and not v.drained
            and v.name not in snap.lemons]
    # Fresh nodes first (no check needed), newest pass first; then stale ones by name.
    return sorted(idle, key=lambda v: (not is_fresh(v, snap.now, cfg),
                                       -(v.last_deep_pass or 0.0), v.name))


def _train_partitions_of(node: str, snap: Snapshot, cfg: ReserveConfig) -> tuple[str, ...]:
    return tuple(p for p in cfg.train_partitions if node in snap.partitions.get(p, ()))


def borrowable(snap: Snapshot, cfg: ReserveConfig, keep: int) -> int:
    """How many train nodes the reserve may borrow: the borrowing policy.

    The train partitions keep at least ``keep`` usable nodes (the largest node count of a
    job queued there, so a queued robust job is never starved by the reserve); only
    idle nodes are ever borrowed (see :func:`_fill_candidates`)."""
    members = set(snap.partitions.get(cfg.partition, ()))
    train = {n for p in cfg.train_partitions for n in snap.partitions.get(p, ())} - members
    usable = [n for n in train if n in snap.nodes and snap.nodes[n].usable]
    return max(len(usable) - keep, 0)


def plan_reconcile(snap: Snapshot, cfg: ReserveConfig, target: int,
                   checked: frozenset[str] = frozenset(), keep: int = 0) -> list[Action]:
    """What brings the reserve to ``target`` spares, borrowing idle train nodes only while
    the train partitions keep ``keep`` usable nodes (:func:`borrowable`).

    Returns DeepCheck actions alone while some node that matters (a stale idle member, or
    a stale candidate needed to fill) has not been checked in this reconcile (``checked``);
    the caller runs them, takes a new snapshot and plans again. Otherwise returns the
    moves: non-spare members home, surplus spares home, candidates into the reserve.
    An empty list means the reserve is at its target.
    """
    now, members = snap.now, snap.partitions.get(cfg.partition, ())
    checks = [DeepCheck(n, "reserve member's deep pass is stale") for n in members
              if n in snap.nodes and n not in checked and _stale_idle(snap.nodes[n], now, cfg)]
    current = spares(snap, cfg)
    need = target - len(current)
    candidates = _fill_candidates(snap, cfg)[:borrowable(snap, cfg, keep)]
    fresh = [v for v in candidates if is_fresh(v, now, cfg)]
    if need > len(fresh):
        stale = [v.name for v in candidates if not is_fresh(v, now, cfg)
                 and v.name not in checked]
        checks += [DeepCheck(n, "candidate for the reserve") for n in stale[:need - len(fresh)]]
    if checks:
        return list(checks)
    actions: list[Action] = []
    home = cfg.home_partition
    for name in members:
        view = snap.nodes.get(name)
        if view is None or name in current or (view.usable and not view.idle
                                                and not view.drained):
            continue  # busy members stay; a job may be running there
        why = "drained" if view.drained else ("not usable" if not view.usable
                                              else "a lemon" if name in snap.lemons
                                              else "deep pass stale or failed")
        actions.append(Move(name, (cfg.partition,), home, f"not a spare: {why}"))
    for name in current[target:] if need < 0 else ():
        actions.append(Move(name, (cfg.partition,), home, f"surplus over target {target}"))
    for view in fresh[:max(need, 0)]:
        actions.append(Move(view.name, _train_partitions_of(view.name, snap, cfg),
                            cfg.partition, f"fill to target {target}"))
    return actions


def _stale_idle(view: NodeView, now: float, cfg: ReserveConfig) -> bool:
    return view.idle and view.usable and not view.drained and not is_fresh(view, now, cfg)


@dataclass
class HandoffPlan:
    """Actions for one job end, and the nodes the job lost."""

    actions: list[Action] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    shortfall: int = 0


def plan_handoff(job_id: str, job_partition: str, requeued: bool, verdicts: Sequence[Verdict],
                 snap: Snapshot, cfg: ReserveConfig,
                 repeat_reasons: Mapping[str, str],
                 ledger: JobLedger | None = None, cap: int | None = None) -> HandoffPlan:
    """Drain the blamed nodes of a job and, if it was requeued, hand it as many spares.

    ``verdicts`` are already validated (nodes the job was given only). Blame from a job is
    a suspicion: the node is drained "pending deep check" (a DOWN node too, so it cannot
    return unchecked). An admin's drain reason is never replaced (a Note records that it
    was kept). ``repeat_reasons`` maps a node to its repeat-offender reason, which
    replaces the pending one. ``ledger`` (what the job was charged before) bounds both
    the drains and the spares by ``cap`` (default ``cfg.job_blame_cap``, else no more
    than the verdicts) over the job's life.
    """
    plan = HandoffPlan()
    ledger = ledger or JobLedger(job_id)
    cap = cap if cap is not None else (cfg.job_blame_cap or len(verdicts))
    room = ledger.drain_room(cap)
    for v in verdicts:
        if v.node not in ledger.drained:
            if room <= 0:
                plan.actions.append(Note(v.node, f"refused: over job_blame_cap="
                                                 f"{cap} nodes for this job "
                                                 f"({v.cls})", job_id))
                continue
            room -= 1
        view = snap.nodes.get(v.node)
        reason = repeat_reasons.get(v.node) or drain_reason(v.cls, v.reason,
                                                            ReasonKind.PENDING)
        plan.lost.append(v.node)
        if view is not None and view.drained and not view.reason.startswith(OUR_PREFIX):
            plan.actions.append(Note(v.node, f"kept admin drain reason {view.reason!r}",
                                     job_id))
        elif view is not None and view.drained and view.reason == reason:
            plan.actions.append(Note(v.node, "already drained with this reason", job_id))
        else:
            plan.actions.append(Drain(v.node, reason, f"verdict of job {job_id}", job_id,
                                      down_too=True))
    if not requeued or not plan.lost:
        return plan
    if job_partition not in cfg.train_partitions:
        plan.actions.append(Note("", f"job partition {job_partition!r} is not a train "
                                     "partition; no spares handed over", job_id))
        return plan
    charged = JobLedger(job_id, sorted(set(ledger.drained) | set(plan.lost)),
                        ledger.handed_over, ledger.broken)
    want = min(len(plan.lost), charged.spare_room(cap))
    available = spares(snap, cfg)
    for name in available[:want]:
        plan.actions.append(Move(name, (cfg.partition,), job_partition,
                                 f"handoff to job {job_id} for {len(plan.lost)} lost node(s)"))
    plan.shortfall = max(want - len(available), 0)
    return plan
