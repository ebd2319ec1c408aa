"""The robust launcher: submitit wrapper, per-node agents, detection, the recovery ladder.

Entry points
    ``slurm-robust submit`` (:func:`~slurm_robust.launcher.submit.executor.submit_run`),
    ``slurm-robust launch`` inside an sbatch script (:mod:`~slurm_robust.launcher.submit.launch`),
    the Python executor :class:`RobustExecutor` (submitit-style), ``slurm-robust status``
    and ``slurm-robust inject``. All of them run the same code in the allocation:
    :func:`run_agent`, one Slurm task per node.

Processes and channels::

    Slurm task 0 ── agent 0 ──── workers (the batch node)     progress: node-local file
    Slurm task 1 ── agent 1 ─┬─ controller threads (TCP JSON lines, see protocol.py)
                             └─ workers (ranks of slot j)      per rank (node/workers.py)
    Slurm task i ── agent i ──── workers, or parked (spare)

The controller starts in agent 1 (agent 0 when the run has one agent) so that it does
not share the batch node's fate; a surviving agent takes over if it is lost
(control/failover.py).

The folders are the planes: ``submit/`` (login node), ``node/`` (every node),
``control/`` (threads in the agent that runs the controller), and shared leaves here;
docs/ARCHITECTURE.md has the planes, the phase table and one killed worker's path
through the code.

- Agents report every ``heartbeat_s`` (worker exits with classified log tails, step
  progress, stack captures) and get back their plan (generation, role, ranks,
  rendezvous). A closed connection or a silent agent is a lost node.
- The controller (its recovery owner) is the one writer of ``<run_dir>/events.jsonl``
  (docs/SCHEMAS.md, ``slurm_robust.event``) and of ``state.json`` (attempt counter, restarts, error
  signatures; it survives requeues).
- Detection: exit status + log tail (classify.py), lost heartbeat, hang (no finished
  step for max(floor, m x median step time); stacks are captured with
  slurm_robust.stacks before anything is killed), NaN/Inf and 5x spikes (checked in the
  worker by slurm_robust.train, which exits 87/88 without snapshotting the bad state).
- The ladder (control/ladder.py, pure; applied by the recovery owner's applier,
  control/applier.py): in-place restart from the
  shared-memory snapshots -> spare node (verdict for the bad node; its ranks restore from
  peer backups) -> ``scontrol requeue`` + StartTime=now + ExcNodeList (no spare left, or
  the controller's node lost: the surviving agents requeue) -> stop with a verdict
  (same user-code error after a clean restart, no progress, restart budget spent).
- Checkpoints: slurm_robust.ckpt, driven by slurm_robust.train in the workers; the
  agent owns the node's shared-memory files across worker restarts and purges them when
  the run completes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Exported names, imported on first use (PEP 562): `slurm-robust update` and `status`
# import a few small modules of this package, and an eager import here made each of them
# load the whole launcher first (agent, controller, recovery, submitit): 0.3-0.5 s of a
# 2-core machine's CPU before `update` wrote its request. __all__ and the TYPE_CHECKING
# imports name the same exports for tools that read them statically.
_EXPORTS = {
    "RunConfig": "slurm_robust.launcher.config",
    "InjectionError": "slurm_robust.launcher.errors",
    "LauncherError": "slurm_robust.launcher.errors",
    "RunStopped": "slurm_robust.launcher.errors",
    "run_agent": "slurm_robust.launcher.node.agent",
    "RobustExecutor": "slurm_robust.launcher.submit.executor",
    "RobustJob": "slurm_robust.launcher.submit.executor",
    "SlurmOptions": "slurm_robust.launcher.submit.executor",
    "submit_run": "slurm_robust.launcher.submit.executor",
    "run_status": "slurm_robust.launcher.submit.status",
}

if TYPE_CHECKING:
    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.errors import InjectionError, LauncherError, RunStopped
    from slurm_robust.launcher.node.agent import run_agent
    from slurm_robust.launcher.submit.executor import (
        RobustExecutor,
        RobustJob,
        SlurmOptions,
        submit_run,
    )
    from slurm_robust.launcher.submit.status import run_status

__all__ = [
    "InjectionError", "LauncherError", "RobustExecutor", "RobustJob", "RunConfig",
    "RunStopped", "SlurmOptions", "run_agent", "run_status", "submit_run",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
