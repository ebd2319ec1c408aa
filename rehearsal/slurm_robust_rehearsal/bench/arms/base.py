"""What every arm of a benchmark that compares the robust launcher with its peers is.

An arm is one way to run the same training on the mini-cluster: the robust launcher
itself (the *subject*) or a peer a user would run without it (plain Slurm ``--requeue``,
torchrun + DCP, NVIDIA's ft_launcher + DCP). Each arm is a module of this package; the
registry (:mod:`slurm_robust_rehearsal.bench.arms`) names them. An arm says whether it
can run here, launches one run of ``bench recovery`` and returns its record, and says
how its figures are keyed in the benchmark's JSON.
"""

from __future__ import annotations

import argparse
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

REPO = Path(__file__).resolve().parents[4]
EXAMPLE = REPO / "examples" / "train_gpt.py"
#: Every restart-from-disk peer's in-job restarts (torchrun's and ft_launcher's agents).
TORCHRUN_MAX_RESTARTS = 3


@dataclass(frozen=True)
class Setup:
    """What decides whether an arm can run here."""

    ft_launcher: str | None = None  # ft_launcher's executable, when found


@dataclass(frozen=True)
class RecoveryRun:
    """One run of ``bench recovery``: the cluster, the options and the example's args."""

    slurm: Any
    cfg: Any
    args: argparse.Namespace
    train: list[str]
    setup: Setup


@dataclass(frozen=True)
class UpdateRun:
    """One run of ``bench update``: the cluster, the options, the example's args and the
    new version's folder."""

    slurm: Any
    cfg: Any
    args: argparse.Namespace
    train: list[str]
    code: Path


@dataclass(frozen=True)
class EttrRun:
    """One run of ``bench ettr``: the options, the faults in turn, and what the subject's
    report says of each peer (its label -> how to run it)."""

    args: argparse.Namespace
    faults: list[str]
    peers: dict[str, str]
    #: Set by the arm once its run recorded its first step (``--arm both`` starts the
    #: peers then); None when nobody waits for it.
    first_step: threading.Event | None = None


Seconds = list[float] | None


@runtime_checkable
class Arm(Protocol):
    """One arm. ``name`` is set by the registry (its key): the ``--arms``/``--arm`` word,
    the entry of the JSON's ``arms`` list and the prefix of its run folders and jobs."""

    name: str
    #: The key of its runs in ``bench recovery``'s JSON.
    label: str
    #: The robust launcher; every other arm is a peer it is measured against.
    subject: bool
    #: Its key under ``steps_redone``.
    redone_key: str
    #: An arm that may be missing here: its key under ``not_measured`` (None: always there).
    optional_key: str | None

    def missing(self, setup: Setup) -> str | None:
        """None when the arm can run here, else how to make it available."""
        ...

    def launch(self, run: RecoveryRun) -> dict[str, Any]:
        """Submit one run, kill a worker after the fault step, wait for the recovery and
        the end; the run's record (``fault_to_next_step_s``, ``steps_redone``,
        ``params_sha256``, ...). Raises SlurmRobustError for a run that never recovers."""
        ...

    def fault_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        """Its entries under ``fault_to_next_step_s`` (seconds per counted round)."""
        ...

    def speedup_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        """A peer's seconds per round keyed by its ``speedup_fault_to_next_step`` key
        (the subject's own: none)."""
        ...


@runtime_checkable
class EttrArm(Arm, Protocol):
    """An arm ``bench ettr --arm`` runs: one long run on the fault schedule."""

    def ettr(self, run: EttrRun) -> dict[str, Any]:
        """Run it on the schedule; its report (``"arm"``: what it is)."""
        ...


@runtime_checkable
class UpdateArm(Arm, Protocol):
    """An arm of ``bench update``: one code change to a running job."""

    #: The key of its runs and figures in ``bench update``'s JSON.
    update_key: str

    def update(self, run: UpdateRun) -> dict[str, Any]:
        """One run changed to ``run.code`` after the change step; its record
        (``downtime_s``, ``steps_redone``, ``params_sha256``, ...)."""
        ...
