"""Deciding what to restore: pure functions over the copies every rank reports."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.ckpt.config import TIERS
from slurm_robust.ckpt.errors import NoValidCheckpointError


@dataclass(frozen=True)
class CopyInfo:
    """One complete copy of one rank's snapshot, as reported by the rank that can read it.

    Attributes:
        rank: whose state the copy holds.
        step: the step it was taken after.
        tier: one of TIERS.
        holder: the rank that reads it (equal to ``rank`` except for the peer tier).
        path: base path of the copy (without .data/.meta) on the holder's node.
        valid: False for a copy that was found but is torn, corrupt or of another
            layout; it is never loaded, but it means "not a fresh start".
    """

    rank: int
    step: int
    tier: str
    holder: int
    path: str
    valid: bool = True


@dataclass(frozen=True)
class RestorePlan:
    """The agreed step and, for every rank, the copy that serves it."""

    step: int
    sources: dict[int, CopyInfo]

    def tiers(self) -> dict[int, str]:
        return {rank: c.tier for rank, c in sorted(self.sources.items())}


@dataclass
class RestoreResult:
    """What ``CheckpointManager.restore`` did.

    ``step`` is None for a fresh start (no copy of any step anywhere); then ``state`` is
    None and ``tiers`` is empty. Otherwise ``state`` is this rank's state (private CPU
    tensors, safe to hand to ``load_state_dict``) and ``tiers`` maps every rank to the
    tier that served it.
    """

    step: int | None
    tiers: dict[int, str] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    seconds: float = 0.0
    attempts: int = 0

    @property
    def fresh(self) -> bool:
        return self.step is None

    def tier_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for tier in self.tiers.values():
            counts[tier] = counts.get(tier, 0) + 1
        return counts


def _preference(copy: CopyInfo) -> tuple[int, int, int]:
    # Tier order first; among equals the rank's own copy, then the lowest holder.
    return (TIERS.index(copy.tier), copy.holder != copy.rank, copy.holder)


def choose_restore_step(copies: Iterable[CopyInfo], world_size: int,
                        exclude: Collection[CopyInfo] = (),
                        durable_every: int | None = None) -> RestorePlan | None:
    """Pick the newest step that every rank has a copy of, and the best copy for each.

    ``copies`` lists what every rank found, invalid ones included; ``exclude`` removes
    copies that failed to load. Returns None for a fresh start: when nothing was found at
    all, or (``durable_every`` given: the run's durable cadence, 0 for none) when the only
    copies are undamaged volatile ones of some ranks, all older than the first durable
    save -- the other ranks' copies went with lost nodes and nothing durable was due yet,
    so there is nothing else to restore. Damaged copies are an error, never a silent
    restart from scratch.

    Raises:
        NoValidCheckpointError: copies exist, but no step is covered for every rank.
    """
    copies = list(copies)
    excluded = set(exclude)
    by_step: dict[int, dict[int, CopyInfo]] = {}
    seen_any = False
    for copy in copies:
        if copy.tier not in TIERS:
            raise ValueError(f"unknown tier {copy.tier!r} in {copy}")
        seen_any = True
        if not copy.valid or copy in excluded or not 0 <= copy.rank < world_size:
            continue
        best = by_step.setdefault(copy.step, {})
        current = best.get(copy.rank)
        if current is None or _preference(copy) < _preference(current):
            best[copy.rank] = copy
    if not seen_any:
        return None
    for step in sorted(by_step, reverse=True):
        if len(by_step[step]) == world_size:
            return RestorePlan(step=step, sources=dict(sorted(by_step[step].items())))
    if durable_every is not None and _lost_before_first_durable(copies, excluded,
                                                                durable_every):
        return None
    raise NoValidCheckpointError(_explain(by_step, world_size, len(excluded)))


def _lost_before_first_durable(copies: list[CopyInfo], excluded: set[CopyInfo],
                               durable_every: int) -> bool:
    if excluded or any(not c.valid or c.tier == "durable" for c in copies):
        return False
    return durable_every <= 0 or max(c.step for c in copies) < durable_every


def _explain(by_step: dict[int, dict[int, CopyInfo]], world_size: int, n_excluded: int) -> str:
    newest = sorted(by_step, reverse=True)[:5]
    lines = [f"no step has a valid checkpoint for all {world_size} ranks "
             f"({n_excluded} copies failed verification)"]
    for step in newest:
        missing = sorted(set(range(world_size)) - set(by_step[step]))
        lines.append(f"  step {step}: missing ranks {missing[:20]}")
    if not by_step:
        lines.append("  no usable copy at all")
    lines.append("next step: restore a durable checkpoint by hand, or start fresh by "
                 "removing this job's checkpoint directories")
    return "\n".join(lines)
