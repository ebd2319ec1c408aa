"""The launcher's closed vocabularies, as ``StrEnum`` (a leaf: only the taxonomy and the
shared vocabulary below it; rungs and run statuses are slurm_robust/vocabulary.py's).

Every value is the string that goes on the wire, into ``state.json`` and into the event
log (docs/SCHEMAS.md), so a member compares equal to the plain string other code and the
analysis read. The run's phases and their allowed transitions are here too: the recovery
applier (control/applier.py) checks every transition against :data:`PHASE_TRANSITIONS`,
and docs/ARCHITECTURE.md shows the same table (a unit test keeps the two in step).
"""

from __future__ import annotations

from enum import StrEnum

# An incident's class and category are the project-wide failure taxonomy (one table,
# slurm_robust/taxonomy.py, shared with the classifier and the analysis).
from slurm_robust.taxonomy import Category
from slurm_robust.taxonomy import FailureClass as IncidentClass
from slurm_robust.vocabulary import Rung, RunStatus

__all__ = ["Category", "IncidentClass", "PHASE_TRANSITIONS", "Phase", "PhaseError",
           "ProgressKind", "Role", "Rung", "RunStatus", "Severity"]


class Phase(StrEnum):
    """Where the run stands, as the controller's recovery owner sees it."""

    GATHER = "gather"      # waiting for the agents of this allocation
    RUNNING = "running"    # a generation of workers runs (or is being started)
    DUMPING = "dumping"    # a hang: stacks are being captured before anything is killed
    DIAGNOSING = "diagnosing"  # an unclear crash: the suspected node runs its self-test
    REPLAYING = "replaying"  # dual-phase replay: reduced-DP groups replay a moving NaN
    REQUEUED = "requeued"  # Slurm was asked to requeue; waiting for this allocation to end
    DONE = "done"          # run_end written, every agent told to exit


#: Allowed phase transitions (from -> the phases it may go to). ``running -> running`` is
#: a new generation (in-place or spare restart); DONE is final.
PHASE_TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.GATHER: frozenset({Phase.RUNNING, Phase.DONE}),
    Phase.RUNNING: frozenset({Phase.RUNNING, Phase.DUMPING, Phase.DIAGNOSING, Phase.REQUEUED,
                              Phase.REPLAYING, Phase.DONE}),
    Phase.DUMPING: frozenset({Phase.RUNNING, Phase.REQUEUED, Phase.DONE}),
    Phase.DIAGNOSING: frozenset({Phase.RUNNING, Phase.REQUEUED, Phase.DONE}),
    Phase.REPLAYING: frozenset({Phase.REPLAYING, Phase.RUNNING, Phase.REQUEUED, Phase.DONE}),
    Phase.REQUEUED: frozenset({Phase.DONE}),
    Phase.DONE: frozenset(),
}


class PhaseError(RuntimeError):
    """A phase transition the table does not allow: a bug in the recovery owner."""


def check_transition(old: Phase, new: Phase) -> None:
    """Raise PhaseError unless ``old -> new`` is in :data:`PHASE_TRANSITIONS`."""
    if new not in PHASE_TRANSITIONS[old]:
        allowed = sorted(p.value for p in PHASE_TRANSITIONS[old]) or ["nothing (final)"]
        raise PhaseError(f"phase {old.value} -> {new.value} is not allowed; from "
                         f"{old.value} only {', '.join(allowed)}")


class Role(StrEnum):
    """What a plan tells an agent to be."""

    NEW = "new"          # an agent before its first plan
    ACTIVE = "active"    # run workers for the plan's ranks
    SPARE = "spare"      # parked, ready to take a slot
    EVICTED = "evicted"  # its node was blamed; idle until the run ends
    HOLD = "hold"        # a requeue is under way: stop workers, wait
    EXIT = "exit"        # the run ended: stop workers and exit


class ProgressKind(StrEnum):
    """The kinds of line a worker writes to its progress file (slurm_robust.train)."""

    STEP = "step"          # a finished step (loss, grad norm, busy time)
    RESTORED = "restored"  # what the worker restored at start (step, tier)
    FINISHING = "finishing"  # training is over; the checkpoint pipeline is flushing
    FINAL = "final"        # the last step and the parameters' digest
    ANOMALY = "anomaly"    # a NaN or spike, written before the worker exits 87/88
    BITWISE = "bitwise"    # the bitwise reference test's digest
    PHASE = "phase"        # the worker entered a phase (an evaluation, a save, a section)


class WorkPhase(StrEnum):
    """What a worker is doing, for hang detection: each has its own limit
    (control/phases.py). A progress line without a phase is ``steps``."""

    STARTUP = "startup"      # a (re)started group before its first step
    STEPS = "steps"          # steady training steps
    EVAL = "eval"            # evaluation / validation
    SAVE = "save"            # a checkpoint save the worker waits for
    SECTION = "section"      # a user-declared section (``run.section(name)``)
    FINISHING = "finishing"  # past the last step: flushing checkpoints, final barrier


class Severity(StrEnum):
    """How bad an in-job monitor finding is (node/monitor.py). A fatal one evicts the
    node through the ladder; a warning is recorded and counted only."""

    WARNING = "warning"
    FATAL = "fatal"
