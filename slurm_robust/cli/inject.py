"""``slurm-robust inject ...``: fault injection for tests and rehearsals.

Two families, both rehearsal tooling in ``slurm_robust.rehearsal.inject``:

- node probes (``probe``, ``clear``): ``slurm_robust.rehearsal.inject.probes_cli``; a probe
  returns a chosen value on one node, everything after it is the real code path;
- job faults (``kill-worker``, ``stop-worker``, ``nan``, ``kill-node``, ``slow-worker``):
  ``slurm_robust.rehearsal.inject.job_cli``; real signals on real processes.

Each module exposes ``register(subparsers)`` adding its actions with ``_run`` defaults.
"""

from __future__ import annotations

import argparse

from slurm_robust.cli.main import import_optional

HELP = "inject faults: node probe values, or real faults in a running robust job"
FAMILIES = ("slurm_robust.rehearsal.inject.probes_cli",
            "slurm_robust.rehearsal.inject.job_cli")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="fault", metavar="FAULT")
    sub.required = True
    for modname in FAMILIES:
        module = import_optional(modname)
        if module is not None:
            module.register(sub)


def run(args: argparse.Namespace) -> int:
    return int(args._inject(args) or 0)
