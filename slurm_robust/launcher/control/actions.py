"""What a detector or phase handler asks of the applier (applier.py), as values.

A detector reads the run and returns one of these, or None when its condition does not
hold; :meth:`Applier.apply` is what carries any of them out. ``Wait`` holds the tick
without changing anything (a failure settling, a capture or a diagnosis in progress).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slurm_robust.launcher.control.generation import (
    Failure,
    Generation,
    HangLimit,
    PendingDiagnosis,
)
from slurm_robust.launcher.control.ladder import Decision
from slurm_robust.launcher.control.monitor import IdleHang
from slurm_robust.launcher.control.replay import ReplayPhase, ReplayRun
from slurm_robust.launcher.control.stop_diagnosis import Conclusion
from slurm_robust.launcher.messages import Incident


@dataclass(frozen=True)
class Wait:
    """The detector's condition holds but there is nothing to do yet."""


@dataclass(frozen=True)
class Finish:
    """End the run with ``status`` (a RunStatus value) and ``verdict``."""

    status: str
    verdict: str | None = None


@dataclass(frozen=True)
class Handle:
    """Run the ladder for ``incident`` of ``gen`` and apply its decision. ``nodes``: the
    nodes it names; ``evict``: why they are blamed whatever the class (a fatal monitor
    finding, a failed bitwise test, a replay's crossing); ``override``: the NaN ladder's
    rung; ``resume``: back to ``running`` first (a hang's capture is over);
    ``diagnosis_passed``: the node's stop-time diagnosis for this incident passed."""

    gen: Generation
    incident: Incident
    signature: str | None
    nodes: Sequence[str]
    evict: str | None = None
    diagnosed_repeat: bool = False
    diagnosis_failed: bool = False
    diagnosis_passed: bool = False
    side: str | None = None  # the classifier's side for the root failure (None: default)
    override: Decision | None = None
    resume: bool = False
    #: What the open incident's generation restored: it ended before a step (a NaN in
    #: the rollback's replay), so its restore is recorded on the incident it cuts short.
    restored: tuple[int | None, str | None] | None = None
    #: The incident was decided before (the NaN's, resolved now by a failed bitwise
    #: test): still open, it is this one, not one it cuts short; closed, it is
    #: recorded again under a new number.
    revisits: bool = False


@dataclass(frozen=True)
class Restart:
    """A hot update is due at this step boundary: a new generation on the same slots."""

    slots: Sequence[int]


@dataclass(frozen=True)
class Capture:
    """A hang: capture every active agent's stacks. ``signal``: the in-job monitor's
    evidence of an idle hang (None: no step for too long)."""

    gen: Generation
    signal: IdleHang | None = None
    #: The declared phase and its limit, when a phase's limit ran out (control/phases.py).
    limit: HangLimit | None = None


@dataclass(frozen=True)
class Diagnose:
    """An unclear crash, nobody blamed: ask the failed node's agent to diagnose it."""

    gen: Generation
    root: Failure
    incident: Incident


@dataclass(frozen=True)
class Concluded:
    """A stop-time diagnosis is over (answered, abandoned, or its agent lost)."""

    gen: Generation
    pending: PendingDiagnosis
    conclusion: Conclusion


@dataclass(frozen=True)
class Start:
    """The gathered agents: the first generation on ``slots`` with ``spares`` parked."""

    slots: Sequence[int]
    spares: Sequence[int]
    slot_nodes: list[str]
    spare_nodes: list[str]


@dataclass(frozen=True)
class BeginReplay:
    """One phase of a dual-phase replay (replay.py): a generation on the NaN's slots
    whose plans give each of ``groups`` its own attempt. ``first``: the replay starts,
    cutting short the rollback's incident if it is still open (``restored``: as Handle)."""

    replay: ReplayRun
    phase: ReplayPhase
    groups: list[list[int]]
    first: bool = False
    restored: tuple[int | None, str | None] | None = None


@dataclass(frozen=True)
class ReplayLost:
    """An agent was lost during a replay: the NaN incident stays open as an in-place
    rollback and the running phase's ladder takes the loss."""

    incident: Incident


@dataclass(frozen=True)
class EndBackoff:
    """A restart held back by an outage's backoff (outage.py) is due, or ``lost`` agents
    of its slots end the wait early."""

    lost: tuple[int, ...] = ()


Action = (Wait | Finish | Handle | Restart | Capture | Diagnose | Concluded | Start
          | BeginReplay | ReplayLost | EndBackoff)
