"""Dual-phase replay (ByteRobust section 4, Algorithm 1): find the machine behind silent
data corruption that the bitwise test does not show.

The job's machines are laid out as an m x n grid (m = k x PP, n = DP / k, m <= n; tensor
parallelism stays inside a machine). The failing steps are replayed twice from the last
good snapshot with a reduced data-parallel size, every group on its own at once: first
on the *horizontal* groups (the grid's rows), then on the *vertical* groups (its
columns). A group fails when a NaN appears in it. One machine is corrupt by assumption,
so it is the cell where the failing row and the failing column cross; it is evicted.

Here a machine is a node and the launcher's layout is pure data parallelism (PP = 1,
TP inside a node); with m x n = the node count, m the largest divisor not above its
square root. Four nodes make a 2 x 2 grid (two replays of two groups of two nodes);
a prime count makes one row (the whole job, a plain replay) and single-node columns.

Pure: nan_recovery.py runs the replays (each one a generation whose plans give every
group its own world, ``plans.replay_plans``) and hands the outcomes back here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from slurm_robust.launcher.control.generation import Generation
from slurm_robust.launcher.messages import Incident

#: The worker's environment variable that carries its replay (train.py reads it).
REPLAY_ENV = "SLURM_ROBUST_REPLAY"
#: Steps replayed past the failing steps' last: corruption at random steps needs a window
#: long enough to show (a group that shows it stops there, the others run it out).
EXTRA_STEPS = 16
#: Longest a replay phase may take before it counts as inconclusive.
PHASE_TIMEOUT_S = 300.0


class ReplayPhase(StrEnum):
    HORIZONTAL = "horizontal"
    VERTICAL = "vertical"


@dataclass(frozen=True)
class Grid:
    """An m x n grid of slot indices (slot = row * n + column): its rows are the
    horizontal groups, its columns the vertical ones."""

    m: int
    n: int

    @classmethod
    def of(cls, machines: int, pp: int = 1) -> Grid:
        """Algorithm 1's grid for ``machines`` nodes: m = k x pp rows, n = machines / m
        columns, m <= n, m as large as that allows (the most even split)."""
        if machines < 1 or pp < 1 or machines % pp:
            raise ValueError(f"{machines} machine(s) do not split into pipelines of {pp}")
        fits = [d for d in range(pp, math.isqrt(machines) + 1, pp) if machines % d == 0]
        m = max(fits, default=pp)
        return cls(m, machines // m)

    def groups(self, phase: ReplayPhase) -> list[list[int]]:
        """The groups of ``phase`` as lists of slot indices (slot = row * n + column)."""
        if phase is ReplayPhase.HORIZONTAL:
            return [[r * self.n + c for c in range(self.n)] for r in range(self.m)]
        return [[r * self.n + c for r in range(self.m)] for c in range(self.n)]

    def locate(self, failed_rows: Sequence[int], failed_cols: Sequence[int]) -> int | None:
        """The slot where the one failing row and the one failing column cross; None
        when either phase did not single out exactly one group (inconclusive)."""
        if len(set(failed_rows)) != 1 or len(set(failed_cols)) != 1:
            return None
        return failed_rows[0] * self.n + failed_cols[0]


@dataclass(frozen=True)
class ReplaySpec:
    """What one agent's workers of a replay run (``SLURM_ROBUST_REPLAY``, JSON): each
    restores ``restore_step`` from its own copy as rank ``global_ranks[LOCAL_RANK]`` of
    ``global_world``, trains up to ``until_step`` in its group's own world, snapshots
    nothing, then exits 0."""

    id: str
    phase: str
    group: int
    global_ranks: tuple[int, ...]
    global_world: int
    restore_step: int | None
    until_step: int

    def global_rank(self, local_rank: int) -> int:
        if not 0 <= local_rank < len(self.global_ranks):
            raise ValueError(f"{REPLAY_ENV}: local rank {local_rank} has no global rank "
                             f"(this node runs {list(self.global_ranks)})")
        return self.global_ranks[local_rank]

    def to_env(self) -> str:
        return json.dumps({"id": self.id, "phase": self.phase, "group": self.group,
                           "global_ranks": list(self.global_ranks),
                           "global_world": self.global_world,
                           "restore_step": self.restore_step,
                           "until_step": self.until_step})

    @classmethod
    def from_env(cls, raw: str) -> ReplaySpec:
        try:
            d = json.loads(raw)
            spec = cls(str(d["id"]), str(d["phase"]), int(d["group"]),
                       tuple(int(r) for r in d["global_ranks"]), int(d["global_world"]),
                       None if d["restore_step"] is None else int(d["restore_step"]),
                       int(d["until_step"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{REPLAY_ENV}={raw!r} does not fit: {exc}") from exc
        if not all(0 <= r < spec.global_world for r in spec.global_ranks):
            raise ValueError(f"{REPLAY_ENV}: ranks {list(spec.global_ranks)} outside a "
                             f"world of {spec.global_world}")
        return spec


@dataclass(frozen=True)
class GroupSeat:
    """One slot's place in a replay phase: its group, the group's slots, its position."""

    group: int
    members: tuple[int, ...]
    position: int


def seats(grid: Grid, phase: ReplayPhase) -> dict[int, GroupSeat]:
    """Slot index -> its seat in ``phase``."""
    out: dict[int, GroupSeat] = {}
    for g, members in enumerate(grid.groups(phase)):
        for pos, slot in enumerate(members):
            out[slot] = GroupSeat(g, tuple(members), pos)
    return out


def window(restore_step: int | None, nan_steps: Sequence[int | None]) -> int:
    """The step a replay trains up to: past every failing step seen, by EXTRA_STEPS."""
    seen = [s for s in nan_steps if s is not None]
    last = max(seen, default=(restore_step or 0) + 1)
    return max(last, (restore_step or 0) + 1) + EXTRA_STEPS


class ReplayEvidence(TypedDict):
    """An incident's ``evidence.nan.replay`` outcome part."""

    grid: list[int]
    groups: dict[str, dict[int, str]]
    located: str | None


def evidence(grid: Grid, outcomes: dict[str, dict[int, str]],
             located: str | None) -> ReplayEvidence:
    """The incident's ``evidence.nan.replay``: the grid, each group's outcome, the node."""
    return {"grid": [grid.m, grid.n], "groups": outcomes, "located": located}


@dataclass
class ReplayRun:
    """A dual-phase replay in progress (the recovery owner's): the NaN incident it
    serves, the generation that NaN ended (the ladder goes on from it), the window, and
    each phase's group outcomes (``nan``, ``passed``, ``error``, ``timeout``)."""

    id: str
    grid: Grid
    incident: Incident
    origin_gen: Generation
    restore_step: int | None
    until_step: int
    started_at: float
    phase: ReplayPhase = ReplayPhase.HORIZONTAL
    phase_started_at: float = 0.0
    outcomes: dict[str, dict[int, str]] = field(default_factory=dict)
    #: Agent index -> its workers that reached ``until_step`` and exited 0.
    done: dict[int, int] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    #: Phases run again because a group ended without an answer (``error``/``timeout``).
    retried: list[str] = field(default_factory=list)

    def group_of(self, slot: int) -> int:
        return seats(self.grid, self.phase)[slot].group

    def settle(self, done: Sequence[int], workers: int, now: float) -> bool:
        """Mark ``passed`` the groups whose every slot's agent (``done``: the agent
        index of each slot) had all its ``workers`` finish; the phase's timeout marks the
        rest. Returns whether every group of the phase has an outcome."""
        out = self.outcomes[self.phase.value]
        for g, members in enumerate(self.grid.groups(self.phase)):
            if g not in out and all(self.done.get(done[m], 0) >= workers for m in members):
                out[g] = "passed"
        total = len(self.grid.groups(self.phase))
        if len(out) < total and now - self.phase_started_at >= PHASE_TIMEOUT_S:
            for g in range(total):
                out.setdefault(g, "timeout")
        return len(out) == total

    def failed(self, phase: ReplayPhase) -> list[int]:
        return sorted(g for g, o in self.outcomes.get(phase.value, {}).items()
                      if o in ("nan", "implied"))

    def unanswered(self) -> bool:
        """Whether a group of this phase ended without an answer (an error or the
        timeout, not a clean run or a NaN): a transient (a worker that could not meet its
        group on a loaded node) rather than a finding, so the phase may run once more."""
        return any(o in ("error", "timeout") for o in self.outcomes[self.phase.value].values())

    def inconclusive(self) -> str | None:
        """Why this phase cannot locate a machine (None: it can go on)."""
        out = self.outcomes[self.phase.value]
        bad = {g: o for g, o in out.items() if o in ("error", "timeout")}
        if bad:
            return f"{self.phase.value} group(s) {sorted(bad)} ended without an answer " \
                   f"({', '.join(sorted(set(bad.values())))})"
        failed = self.failed(self.phase)
        if len(failed) != 1:
            return f"{len(failed)} {self.phase.value} group(s) reproduced the NaN " \
                   "(one machine is assumed)"
        return None
