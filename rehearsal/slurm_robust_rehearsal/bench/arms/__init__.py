"""The arms of the benchmarks that compare the robust launcher with its peers
(``bench recovery``, ``bench ettr``, ``bench update``): one module per arm, each a
class satisfying :class:`~slurm_robust_rehearsal.bench.arms.base.Arm`, and
:data:`REGISTRY`, the one place their names are written.

Adding a peer: a module here with its class (see plain.py, torchrun.py, ft_launcher.py)
and one line in :data:`REGISTRY`. The registry's order is the order the benchmarks list
the arms in (``--arms`` help, the JSON's ``arms``, the keys of the runs).
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_robust_rehearsal.bench.arms.base import (
    Arm,
    EttrArm,
    EttrRun,
    RecoveryRun,
    Setup,
    UpdateArm,
    UpdateRun,
)
from slurm_robust_rehearsal.bench.arms.ft_launcher import FtLauncher
from slurm_robust_rehearsal.bench.arms.plain import PlainRequeue
from slurm_robust_rehearsal.bench.arms.robust import RobustLauncher
from slurm_robust_rehearsal.bench.arms.torchrun import Torchrun

#: Arm name -> its class, built with that name. The only place the names are spelled.
REGISTRY: dict[str, Callable[[str], Arm]] = {
    "plain": PlainRequeue,
    "torchrun": Torchrun,
    "ft_launcher": FtLauncher,
    "robust": RobustLauncher,
}

#: Every arm, by name, in the registry's order.
ARMS: dict[str, Arm] = {name: make(name) for name, make in REGISTRY.items()}


def subject() -> Arm:
    """The robust launcher's arm (the one every peer is measured against)."""
    return next(arm for arm in ARMS.values() if arm.subject)


def ettr_arms() -> list[EttrArm]:
    """The arms ``bench ettr --arm`` can run, the subject first."""
    return sorted((a for a in ARMS.values() if isinstance(a, EttrArm)),
                  key=lambda a: not a.subject)


def update_arms() -> list[UpdateArm]:
    """The arms of ``bench update``, the subject first."""
    return sorted((a for a in ARMS.values() if isinstance(a, UpdateArm)),
                  key=lambda a: not a.subject)


__all__ = ["ARMS", "REGISTRY", "Arm", "EttrArm", "EttrRun", "RecoveryRun", "Setup", "UpdateArm",
           "UpdateRun", "ettr_arms", "subject", "update_arms"]
