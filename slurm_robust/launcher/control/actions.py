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


Action = Wait | Finish | Handle | Restart | Capture | Diagnose | Concluded | Start
