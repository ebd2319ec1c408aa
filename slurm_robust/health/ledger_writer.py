"""Recording into the node ledger from the paths that decide about nodes, without ever
holding them up: every failure (no site config, an unsafe directory, a locked or broken
database, a bad name) is one warning line and the caller goes on.

The prolog/epilog, EpilogSlurmctld's verdicts, the deep check and the breaker call
:func:`record_safely` after (or beside) their decision; none of them may drain later,
or not at all, because bookkeeping failed. Events that can change the lemon set (a
blame, a deep check) also republish the lemons file (health/lemons.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.lemons import lemons, publish, read_published
from slurm_robust.health.node_ledger import (
    EventKind,
    LedgerConfig,
    NodeEvent,
    NodeLedger,
    ledger_config,
)
from slurm_robust.site_config import SiteConfig, load_site_config

log = logging.getLogger("slurm_robust.ledger")

#: Events after which the lemons file is recomputed.
LEMON_KINDS = frozenset({EventKind.BLAME, EventKind.DEEP_CHECK_FAILED,
                         EventKind.DEEP_CHECK_PASSED, EventKind.PARDON})


def site_ledger_config(site: SiteConfig | None = None) -> LedgerConfig:
    """The ``ledger`` section of ``site`` (default: the site config file); UsageError
    for one that does not fit."""
    return ledger_config((site or load_site_config()).ledger)


def record_safely(events: Sequence[NodeEvent], site: SiteConfig | None = None,
                  warn: Callable[[str], Any] | None = None) -> bool:
    """Record ``events``; returns whether they were written. Never raises: a failure is
    passed to ``warn`` (default: the ``slurm_robust.ledger`` logger's warning)."""
    warn = warn or log.warning
    if not events:
        return True
    try:
        cfg = site_ledger_config(site)
        if not cfg.enabled:
            return False
        ledger = NodeLedger(cfg)
        ledger.record(events)
    except (SlurmRobustError, OSError, ValueError) as exc:
        warn(f"node ledger not updated ({len(events)} event(s) of "
             f"{', '.join(sorted({e.node for e in events}))[:200]}): {exc}")
        return False
    except Exception as exc:  # noqa: BLE001 - bookkeeping must never break a drain path
        warn(f"node ledger not updated: unexpected {type(exc).__name__}: {exc}")
        return False
    if any(e.kind in LEMON_KINDS for e in events):
        try:
            publish(cfg.lemons_path, lemons(ledger))
        except (SlurmRobustError, OSError, ValueError) as exc:
            warn(f"recorded, but the lemons file {cfg.lemons_path} not updated: {exc}")
    return True


def current_lemons(site: SiteConfig | None = None,
                   warn: Callable[[str], Any] | None = None) -> frozenset[str]:
    """The lemons now, for the reserve (root/SlurmUser): from the database, else from the
    published file, else none. Never raises: a ledger that cannot be read keeps no node
    out of the reserve (the deep check and freshness rules still hold), and says so."""
    warn = warn or log.warning
    try:
        cfg = site_ledger_config(site)
    except SlurmRobustError as exc:
        warn(f"lemons not known (ledger config): {exc}")
        return frozenset()
    if not cfg.enabled:
        return frozenset()
    ledger = NodeLedger(cfg)
    try:
        if not ledger.path.exists():
            return frozenset()  # nothing recorded yet: no lemons
        names = lemons(ledger)
        publish(cfg.lemons_path, names)  # a lemon whose blames aged out is dropped here
        return frozenset(names)
    except (SlurmRobustError, OSError, ValueError) as exc:
        warn(f"node ledger not read ({exc}); using the published lemons")
    try:
        return frozenset(read_published(cfg.lemons_path))
    except (OSError, ValueError) as exc:
        warn(f"lemons not known: {exc}")
        return frozenset()


@dataclass(frozen=True)
class SiteLedger:
    """The node ledger as the reserve uses it: record events, ask for the lemons. Both
    never raise (see record_safely, current_lemons)."""

    site: SiteConfig | None = None

    def record(self, events: Sequence[NodeEvent]) -> bool:
        return record_safely(events, self.site)

    def lemons(self) -> frozenset[str]:
        return current_lemons(self.site)
