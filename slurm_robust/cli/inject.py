"""``slurm-robust inject ...``: fault injection for tests and rehearsals.

Two families, both rehearsal tooling in ``slurm_robust_rehearsal.inject``:

- node probes (``probe``, ``clear``): ``slurm_robust_rehearsal.inject.probes_cli``; a probe
  returns a chosen value on one node, everything after it is the real code path;
- job faults (``kill-worker``, ``stop-worker``, ``nan``, ``kill-node``, ``slow-worker``):
  ``slurm_robust_rehearsal.inject.job_cli``; real signals on real processes;
- network faults on the ``cluster up --netns`` mini-cluster (``partition``, ``link-slow``):
  ``slurm_robust_rehearsal.inject.network_cli``.

The rehearsal tooling is a distribution of its own, reached here by name only: where it
is not installed, ``inject`` says in one line how to install it.

Each module exposes ``register(subparsers)`` adding its actions with ``_inject``
defaults. The actions of each family are also listed here, so that a family whose module
fails to import still shows them, as unavailable, instead of losing them silently.
"""

from __future__ import annotations

import argparse

from slurm_robust.cli.optional import (
    Unavailable,
    add_unavailable,
    import_optional,
    require_rehearsal,
)

require_rehearsal()

HELP = "inject faults: node probe values, or real faults in a running robust job"
# module -> the actions it registers (checked against register() by a unit test)
FAMILIES: dict[str, tuple[str, ...]] = {
    "slurm_robust_rehearsal.inject.probes_cli": ("probe", "clear"),
    "slurm_robust_rehearsal.inject.job_cli": (
        "kill-worker", "stop-worker", "nan", "kill-node", "slow-worker", "sdc"),
    "slurm_robust_rehearsal.inject.network_cli": ("partition", "link-slow"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fault", metavar="FAULT")
    sub.required = True
    for modname, actions in FAMILIES.items():
        module = import_optional(modname)
        if isinstance(module, Unavailable):
            for action in actions:
                add_unavailable(sub, action, module, "_inject")
        else:
            module.register(sub)


def run(args: argparse.Namespace) -> int:
    return int(args._inject(args) or 0)
