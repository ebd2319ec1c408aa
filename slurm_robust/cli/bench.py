"""``slurm-robust bench NAME``: benchmarks that print their numbers as JSON.

Each benchmark is a module of ``slurm_robust_rehearsal.bench`` (the rehearsal tooling, a
distribution of its own) exposing ``HELP``, ``add_arguments(parser)`` and
``run(args) -> dict``; the dict is printed as JSON (``--json``) or as indented JSON for
people. Targets are checked by reading these numbers, never by timed tests. The modules
are imported by name: where the rehearsal tooling is not installed, ``bench`` says in one
line how to install it.
"""

from __future__ import annotations

import argparse
import json

from slurm_robust.cli.optional import (
    Unavailable,
    add_unavailable,
    import_optional,
    require_rehearsal,
)

require_rehearsal()

BENCHMARKS: dict[str, str] = {
    "prolog": "slurm_robust_rehearsal.bench.prolog",
    "ckpt": "slurm_robust_rehearsal.bench.ckpt",
    "stacks": "slurm_robust_rehearsal.bench.stacks",
    "analysis": "slurm_robust_rehearsal.bench.analysis",
    "recovery": "slurm_robust_rehearsal.bench.recovery",
    "simulate": "slurm_robust_rehearsal.bench.simulate",
    "classify": "slurm_robust_rehearsal.bench.classify",
    "metrics": "slurm_robust_rehearsal.bench.metrics",
    "ettr": "slurm_robust_rehearsal.bench.ettr",
    "phases": "slurm_robust_rehearsal.bench.phases",
    "monitor": "slurm_robust_rehearsal.bench.monitor",
    "update": "slurm_robust_rehearsal.bench.update",
    "scale": "slurm_robust_rehearsal.bench.scale",
    "many-nodes": "slurm_robust_rehearsal.bench.many_nodes",
}

HELP = "run a benchmark and print its numbers as JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="NAME")
    sub.required = True
    for name, modname in BENCHMARKS.items():
        module = import_optional(modname)
        if isinstance(module, Unavailable):
            add_unavailable(sub, name, module, "_bench")
            continue
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument("--json", action="store_true", help="print one line of JSON")
        module.add_arguments(p)
        p.set_defaults(_bench=module.run)


def run(args: argparse.Namespace) -> int:
    result = args._bench(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
