"""Importing a feature module for the CLI without letting a broken one vanish.

The subcommand, benchmark and fault-injection registries import their modules by name.
A module that fails to import (a missing dependency, a module left out of this build, a
bug) stays visible: ``--help`` lists it as ``unavailable: <reason>``, and invoking it
prints that reason as one line and exits non-zero, instead of the entry silently missing
or the whole CLI failing because of one feature.

The rehearsal tooling (the mini-cluster, fault injection, benchmarks) is a second
distribution, ``slurm_robust_rehearsal`` (rehearsal/ in the checkout), that the library
never imports: its subcommands are reached by name, and where it is not installed they
say in one line how to install it (:func:`slurm_robust.tooling.require_rehearsal`).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import NoReturn

from slurm_robust.errors import SlurmRobustError
from slurm_robust.tooling import (
    REHEARSAL,
    REHEARSAL_MISSING,
    RehearsalMissingError,
    rehearsal_installed,
    require_rehearsal,
)

__all__ = ["REHEARSAL", "REHEARSAL_MISSING", "FeatureUnavailableError", "RehearsalMissingError",
           "Unavailable", "add_unavailable", "import_optional", "rehearsal_installed",
           "require_rehearsal"]


class FeatureUnavailableError(SlurmRobustError):
    """A subcommand whose module could not be imported was invoked."""


@dataclass(frozen=True)
class Unavailable:
    """A feature module that failed to import, and why."""

    modname: str
    reason: str

    def fail(self, _args: argparse.Namespace | None = None) -> NoReturn:
        raise FeatureUnavailableError(f"unavailable: {self.reason}")


def import_optional(modname: str) -> ModuleType | Unavailable:
    """The module, or an :class:`Unavailable` naming the exception that stopped it (where
    the rehearsal tooling is missing: how to install it)."""
    try:
        return importlib.import_module(modname)
    except RehearsalMissingError as exc:
        return Unavailable(modname, str(exc))
    except Exception as exc:  # noqa: BLE001 - any import failure must stay visible, see above
        if isinstance(exc, ModuleNotFoundError) and exc.name == REHEARSAL:
            return Unavailable(modname, REHEARSAL_MISSING)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Unavailable(modname, f"{modname}: {type(exc).__name__}: {first}".rstrip(": "))


def add_unavailable(subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
                    name: str, missing: Unavailable, default: str) -> argparse.ArgumentParser:
    """Register ``name`` so that it shows ``unavailable: <reason>`` in ``--help`` and
    fails with that reason when invoked (through the ``default`` callable key)."""
    text = f"unavailable: {missing.reason}"
    # No option prefix and a catch-all positional: whatever follows (``--node x``,
    # ``--help``) is swallowed, so the user sees why the command is unavailable rather
    # than argparse's complaint about options it cannot know.
    p = subparsers.add_parser(name, help=text, description=text, prefix_chars="\0",
                              add_help=False)
    p.add_argument("ignored", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(**{default: missing.fail})
    return p
