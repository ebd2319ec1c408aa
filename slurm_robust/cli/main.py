"""Entry point of ``slurm-robust``.

Each subcommand lives in its own module ``slurm_robust.cli.<name>`` exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; ``cluster``'s
is the rehearsal tooling's (``slurm_robust_rehearsal.cluster.cli``, a distribution of its
own, named here and never imported otherwise: where it is not installed, the subcommand
says in one line how to install it). Modules are
imported only when their subcommand runs (and to build ``--help``), so a quick command
does not pay for torch or pandas. A module that fails to import is listed in ``--help`` as
``unavailable: <reason>`` and fails with that reason when invoked (see optional.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from slurm_robust.cli.optional import Unavailable, add_unavailable, import_optional
from slurm_robust.errors import SlurmRobustError

# name -> module; order is the order shown in --help.
SUBCOMMANDS: dict[str, str] = {
    "cluster": "slurm_robust_rehearsal.cluster.cli",
    "check": "slurm_robust.cli.check",
    "node": "slurm_robust.cli.node",
    "inject": "slurm_robust.cli.inject",
    "reserve": "slurm_robust.cli.reserve",
    "breaker": "slurm_robust.cli.breaker",
    "submit": "slurm_robust.cli.submit",
    "launch": "slurm_robust.cli.launch",
    "status": "slurm_robust.cli.status",
    "update": "slurm_robust.cli.update",
    "changes": "slurm_robust.cli.changes",
    "stacks": "slurm_robust.cli.stacks",
    "report": "slurm_robust.cli.report",
    "bench": "slurm_robust.cli.bench",
    "simulate": "slurm_robust.cli.simulate",
    "exporter": "slurm_robust.cli.exporter",
}

LOG_LEVEL_ENV = "SLURM_ROBUST_LOG_LEVEL"


def _load(name: str) -> ModuleType | Unavailable:
    return import_optional(SUBCOMMANDS[name])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; with ``only``, import just that subcommand's module."""
    parser = argparse.ArgumentParser(
        prog="slurm-robust",
        description="Fault-tolerant training on Slurm: node checks, warm reserve, "
                    "per-step checkpoints, recovery ladder, post-mortems.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = _load(name)
        if isinstance(module, Unavailable):
            add_unavailable(sub, name, module, "_run")
            continue
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


#: Options whose value usually starts with a dash (``--resume-args '--init_from=resume'``),
#: which argparse would take for an option: glued as ``--opt=value`` before parsing.
DASH_VALUE_OPTIONS = ("--resume-args", "--args")


def glue_dash_values(argv: list[str]) -> list[str]:
    """``[--resume-args, -x]`` -> ``[--resume-args=-x]``, up to the command's ``--``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        if a in DASH_VALUE_OPTIONS and i + 1 < len(argv):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=os.environ.get(LOG_LEVEL_ENV, "WARNING").upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in SUBCOMMANDS else None)
    args = parser.parse_args(glue_dash_values(argv))
    run = getattr(args, "_run", None)
    if run is None:
        parser.error(f"subcommand {args.command!r} is not available in this build")
    try:
        return int(run(args) or 0)
    except SlurmRobustError as exc:
        print(f"slurm-robust {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"slurm-robust {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`slurm-robust status | head`): what it read is what it
        # wanted. Point stdout at /dev/null so the exit's flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
