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
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.lemons import lemons, publish
from slurm_robust.health.node_ledger import (
    EventKind,
    LedgerConfig,
    NodeEvent,
    NodeLedger,
    ledger_config,
)
from slurm_robust.site_config import load_site_config

log = logging.getLogger("slurm_robust.ledger")

#: Events after which the lemons file is recomputed.
LEMON_KINDS = frozenset({EventKind.BLAME, EventKind.DEEP_CHECK_FAILED,
                         EventKind.DEEP_CHECK_PASSED, EventKind.PARDON})


def site_ledger_config() -> LedgerConfig:
    """The site config's ``ledger`` section (UsageError for one that does not fit)."""
    return ledger_config(load_site_config().ledger)


def record_safely(events: Sequence[NodeEvent], cfg: LedgerConfig | None = None,
                  warn: Callable[[str], Any] | None = None) -> bool:
    """Record ``events``; returns whether they were written. Never raises: a failure is
    passed to ``warn`` (default: the ``slurm_robust.ledger`` logger's warning)."""
    warn = warn or log.warning
    if not events:
        return True
    try:
        cfg = cfg or site_ledger_config()
        if not cfg.enabled:
            return False
        ledger = NodeLedger(cfg)
        ledger.record(events)
        if any(e.kind in LEMON_KINDS for e in events):
            publish(cfg.lemons_path, lemons(ledger))
    except (SlurmRobustError, OSError, ValueError) as exc:
        warn(f"node ledger not updated ({len(events)} event(s) of "
             f"{', '.join(sorted({e.node for e in events}))[:200]}): {exc}")
        return False
    except Exception as exc:  # noqa: BLE001 - bookkeeping must never break a drain path
        warn(f"node ledger not updated: unexpected {type(exc).__name__}: {exc}")
        return False
    return True
