"""Keeping lemons out of a new submission: the node ledger's lemons (health/lemons.py),
which a user reads from the published lemons file, become part of sbatch's
``--exclude``. ``allow_lemons`` (``--allow-lemons``) turns it off.

A missing file means no lemon was ever recorded; an unreadable or malformed one is a
warning and the job is submitted without the exclusion (a broken list must not stop
every submission, and a planted one must not smuggle options into sbatch:
read_published accepts node names only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.lemons import read_published
from slurm_robust.health.node_ledger import ledger_config
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import expand_hostlist

log = logging.getLogger("slurm_robust.submit")


def merge_exclude(exclude: str | None, lemons: Iterable[str]) -> str | None:
    """``exclude`` (a Slurm hostlist, possibly compressed) plus ``lemons``, as one
    comma-separated list without repeats; None when both are empty."""
    names = list(expand_hostlist(exclude)) if exclude else []
    names += [n for n in sorted(set(lemons)) if n not in names]
    return ",".join(names) or None


def site_lemons(site_config: str | None = None,
                warn: Callable[[str], Any] | None = None) -> list[str]:
    """The published lemons of the site config at ``site_config`` (None: the default
    path); never raises, see the module doc."""
    warn = warn or log.warning
    try:
        cfg = ledger_config(load_site_config(site_config).ledger)
        if not cfg.enabled:
            return []
        return read_published(cfg.lemons_path)
    except FileNotFoundError:
        return []
    except (OSError, ValueError, SlurmRobustError) as exc:
        warn(f"lemons not excluded from this job: {exc}")
        return []


def exclude_for_submit(exclude: str | None, allow_lemons: bool, site_config: str | None,
                       warn: Callable[[str], Any] | None = None) -> str | None:
    """What sbatch's ``--exclude`` gets: the user's own list, plus the lemons unless
    ``allow_lemons``."""
    if allow_lemons:
        return exclude
    return merge_exclude(exclude, site_lemons(site_config, warn))
