"""The NaN ladder (ByteRobust section 4): where a NaN began, and what to do about it.

Attribution: every rank's ``anomaly`` line says whether the non-finite value was in its
own loss or local grad norm before the gradient collective (``local``, written by
``RobustRun.local_check``). The origin is the rank(s) that had it locally at the earliest
step; no such rank (the script does not call ``local_check``, or the value appeared only
after the collective) is "origin unknown", and then no node is named.

The ladder, one decision per NaN incident (:meth:`NanLadder.decide`):

1. ``reattempt``: the first NaN restores the last good step and replays the same batches
   (the data is a function of the step, so the replay is exact).
2. The NaN returns at the same step with the same origin: the data or the model. The
   user's policy applies: ``stop`` ends the run with a verdict naming the step and the
   data position, ``skip`` drops that batch (``<run_dir>/nan/skip.json``, read by the
   workers) and replays again. No node is blamed either way.
3. It returns elsewhere (another step or origin): silent data corruption is suspected
   and the run rolls back again (``rollback``).
4. It moves again after that rollback: dual-phase replay (``replay``, control/replay.py)
   replays the failing steps on reduced data-parallel groups to find the machine.

The bitwise reference test (control/bitwise.py) runs at the start of every replaying
attempt (reattempt and rollback: it costs milliseconds, so it is not held back until a
second failure); a node whose digest differs is evicted (``evict``) whatever the NaN
was; dual-phase replay (rung 4) is for corruption the bitwise test does not show.

A replay that gets CLEAN_STEPS past the NaN's step closes the episode
(:meth:`NanLadder.on_step`); a NaN before that, elsewhere, is the same one moving. The
open episode and the skipped batches are part of ``state.json``, so a requeued
allocation's controller (or a failover successor) goes on from the same rung.
Pure but for :func:`write_skips`; nan_recovery.py applies the decisions.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict

from slurm_robust.launcher.nan_files import NAN_FILES_VERSION, SKIP_FILE, nan_dir
from slurm_robust.records import write_json_atomic

#: Clean steps past a NaN's step that end its episode. Corruption at random steps
#: shows again a few steps further on each replay; counted as a new episode each time,
#: it would be reattempted for ever and never reach the bitwise test's verdict or the
#: dual-phase replay.
CLEAN_STEPS = 16

#: Longest wait after the first NaN exit for every rank's anomaly line (the origin's may
#: come in a later agent report than the first reporter's).
NAN_SETTLE_S = 2.0


class NanPolicy(StrEnum):
    """What to do with a NaN that comes back on replay (the data or the model)."""

    STOP = "stop"
    SKIP = "skip"


class NanResolution(StrEnum):
    """How one NaN incident was resolved (``evidence.nan.resolution``)."""

    REATTEMPT = "reattempt"  # restore the last good step, replay the same batches
    STOP = "stop"            # it came back at the same place: stopped (policy stop)
    SKIP = "skip"            # it came back at the same place: that batch skipped
    ROLLBACK = "rollback"    # it came back elsewhere (suspected SDC): rolled back again
    REPLAY = "replay"        # it moved again: dual-phase replay to find the machine
    EVICT = "evict"          # a node failed the bitwise test



class OriginEvidence(TypedDict):
    """A NaN origin in an incident's ``evidence.nan`` (docs/SCHEMAS.md)."""

    origin: str
    origin_ranks: list[int]
    origin_nodes: list[str]
    step: int | None
    data_position: Any
    origin_reason: str


class OriginState(TypedDict):
    """A NaN origin as ``state.json`` keeps it."""

    step: int | None
    ranks: list[int]
    nodes: list[str]
    data_position: Any
    reason: str


class LadderState(TypedDict):
    """``state.json``'s ``nan_ladder``: the episode awaiting its replay, skipped batches."""

    last: OriginState | None
    last_at: float | None
    skipped: list[int]
    moves: int
    steps: list[int]

@dataclass(frozen=True)
class NanOrigin:
    """Where a NaN first appeared: the ranks (and their nodes) that had it locally at
    ``step``; empty ``ranks`` is "origin unknown" with ``reason`` saying why."""

    step: int | None
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    data_position: Any = None
    reason: str = ""

    @property
    def known(self) -> bool:
        return bool(self.ranks)

    def describe(self) -> str:
        if not self.known:
            return "origin unknown"
        return ", ".join(f"{n} rank {r}" for r, n in zip(self.ranks, self.nodes, strict=True))

    def same_place(self, other: NanOrigin) -> bool:
        return self.step == other.step and self.ranks == other.ranks

    def to_json(self) -> OriginEvidence:
        return {"origin": self.describe(), "origin_ranks": list(self.ranks),
                "origin_nodes": sorted(set(self.nodes)), "step": self.step,
                "data_position": self.data_position, "origin_reason": self.reason}

    def to_state(self) -> OriginState:
        return {"step": self.step, "ranks": list(self.ranks), "nodes": list(self.nodes),
                "data_position": self.data_position, "reason": self.reason}

    @classmethod
    def from_state(cls, raw: Mapping[str, Any]) -> NanOrigin:
        step, ranks, nodes = raw.get("step"), raw.get("ranks", []), raw.get("nodes", [])
        if not (step is None or type(step) is int) or not isinstance(ranks, list) \
                or not isinstance(nodes, list) or len(ranks) != len(nodes) \
                or not all(type(r) is int for r in ranks) \
                or not all(isinstance(n, str) for n in nodes):
            raise ValueError(f"NaN origin {dict(raw)!r}: step, ranks and nodes do not fit")
        return cls(step, tuple(ranks), tuple(nodes), raw.get("data_position"),
                   str(raw.get("reason", "")))


def attribute(anomalies: Mapping[int, Mapping[str, Any]],
              rank_nodes: Sequence[str]) -> NanOrigin:
    """The origin from each rank's ``anomaly`` line (rank -> its fields)."""
    nans = {r: a for r, a in anomalies.items() if a.get("what") == "nan"}
    steps = [a["step"] for a in nans.values() if isinstance(a.get("step"), int)]
    first = min(steps) if steps else None
    local = {r: a for r, a in nans.items() if a.get("local") is True
             and isinstance(a.get("step"), int)}
    if not local:
        checked = bool(nans) and all(a.get("local") is False for a in nans.values())
        reason = ("every reporting rank was finite before the collective: the value "
                  "appeared in or after it" if checked else
                  "no rank checked its own values before the collective "
                  "(run.local_check not called)" if nans else "no anomaly line arrived")
        return NanOrigin(first, reason=reason)
    step = min(a["step"] for a in local.values())
    ranks = tuple(sorted(r for r, a in local.items() if a["step"] == step))
    nodes = tuple(rank_nodes[r] if 0 <= r < len(rank_nodes) else "?" for r in ranks)
    return NanOrigin(step, ranks, nodes, local[ranks[0]].get("data_position"),
                     f"non-finite {local[ranks[0]].get('local_name')} before the collective")


@dataclass(frozen=True)
class NanStep:
    """One NaN incident's resolution, its reason, and the batch to skip (if any)."""

    resolution: NanResolution
    reason: str
    verdict: str | None = None   # "data_or_model" / "sdc_suspected"
    skip_step: int | None = None
    replay_s: float | None = None  # time from the previous NaN incident (one replay)


@dataclass
class NanLadder:
    """The NaN episode of a run: the previous incident's origin awaiting its replay."""

    policy: NanPolicy = NanPolicy.STOP
    last: NanOrigin | None = None
    last_at: float | None = None
    skipped: list[int] = field(default_factory=list)
    #: Times the NaN moved in this episode (the second move asks for dual-phase replay).
    moves: int = 0
    #: The steps the NaN appeared at in this episode (a replay's window covers them).
    steps: list[int] = field(default_factory=list)

    def decide(self, origin: NanOrigin, now: float | None = None) -> NanStep:
        now = time.time() if now is None else now
        prev, prev_at = self.last, self.last_at
        replay_s = None if prev_at is None else round(now - prev_at, 3)
        self.last, self.last_at = origin, now
        if origin.step is not None:
            self.steps.append(origin.step)
        where = f"step {origin.step} (data position {origin.data_position}), " \
                f"{origin.describe()}"
        if prev is None:
            return NanStep(NanResolution.REATTEMPT, f"NaN at {where}: restoring the last "
                           "good step and replaying the same batches")
        if origin.same_place(prev):
            if self.policy is NanPolicy.SKIP and origin.step is not None:
                self.skipped.append(origin.step)
                self._close()
                return NanStep(NanResolution.SKIP, f"NaN came back at {where} after a replay: "
                               "the data or the model; skipping that batch (--nan-policy "
                               "skip); no node is blamed", "data_or_model", origin.step,
                               replay_s)
            return NanStep(NanResolution.STOP, f"NaN came back at {where} after replaying "
                           "from the last good step: the data or the model, not a machine; "
                           "inspect or drop that batch (--nan-policy skip) and resubmit",
                           "data_or_model", None, replay_s)
        self.moves += 1
        moved = f"NaN moved on replay (before: step {prev.step}, {prev.describe()}; " \
                f"now {where})"
        if self.moves >= 2:
            return NanStep(NanResolution.REPLAY, f"{moved}, again after a rollback: "
                           "suspected silent data corruption the bitwise test did not "
                           "show; dual-phase replay to find the machine", "sdc_suspected",
                           None, replay_s)
        return NanStep(NanResolution.ROLLBACK, f"{moved}: suspected silent data "
                       "corruption; rolling back again", "sdc_suspected", None, replay_s)

    def on_step(self, step: int) -> None:
        """A finished step: a replay that got CLEAN_STEPS past the NaN's step ends the
        episode (a NaN soon after it, at another step, is the same one moving)."""
        if self.last is not None and self.last.step is not None and \
                step >= self.last.step + CLEAN_STEPS:
            self._close()

    def on_evicted(self) -> None:
        """The episode's machine was found and evicted: the next NaN is a new episode."""
        self._close()

    def _close(self) -> None:
        self.last = self.last_at = None
        self.moves, self.steps = 0, []

    def to_state(self) -> LadderState:
        """What a requeued or successor controller needs (``state.json``'s
        ``nan_ladder``): the episode awaiting its replay and the batches skipped so far."""
        return {"last": None if self.last is None else self.last.to_state(),
                "last_at": self.last_at, "skipped": list(self.skipped),
                "moves": self.moves, "steps": list(self.steps)}

    @classmethod
    def from_state(cls, policy: NanPolicy, raw: Mapping[str, Any] | None) -> NanLadder:
        """The ladder as persisted by :meth:`to_state` (a fresh one for None); raises
        ValueError for a record that does not fit (never silently reset: a reset would
        replay a data NaN once more and forget which batches were skipped)."""
        if raw is None:
            return cls(policy)
        last, last_at, skipped = raw.get("last"), raw.get("last_at"), raw.get("skipped", [])
        moves, steps = raw.get("moves", 0), raw.get("steps", [])
        if not (last is None or isinstance(last, Mapping)) \
                or not (last_at is None or isinstance(last_at, int | float)) \
                or not isinstance(skipped, list) or not all(type(s) is int for s in skipped) \
                or type(moves) is not int or moves < 0 \
                or not isinstance(steps, list) or not all(type(s) is int for s in steps):
            raise ValueError(f"NaN ladder state {dict(raw)!r} does not fit")
        return cls(policy, None if last is None else NanOrigin.from_state(last),
                   None if last_at is None else float(last_at), list(skipped), moves,
                   list(steps))


def write_skips(run_dir: str | Path, steps: Sequence[int]) -> Path:
    """``<run_dir>/nan/skip.json``: the batches the workers skip from their next start."""
    path = nan_dir(run_dir) / SKIP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"v": NAN_FILES_VERSION, "steps": sorted(set(steps)),
                             "time": time.time()}, mode=0o600)
    return path
