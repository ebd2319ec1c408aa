"""The words records share: recovery rungs, how a run ended, a health check's verdict.

One leaf (it imports nothing of the package) that the launcher, the health checks, the
post-mortem analysis, the fleet simulator and the synthetic fleet all take these from,
so a new rung or status is added here once. Each is a ``StrEnum``: a member compares
equal to the string written in the records (docs/SCHEMAS.md).
"""

from __future__ import annotations

from enum import StrEnum


class Rung(StrEnum):
    """The recovery ladder's rungs, cheapest first (launcher/control/ladder.py decides)."""

    IN_PLACE = "in_place"
    SPARE = "spare"
    REQUEUE = "requeue"
    STOP = "stop"


class RunStatus(StrEnum):
    """How a run ended (``run_end.status``), or how one controller's part in it did."""

    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"
    #: A controller replaced by a successor (failover.py): the run's end is not its own.
    #: Never in a ``run_end`` record.
    STOOD_DOWN = "stood_down"


class HealthStatus(StrEnum):
    """A check's verdict. ``warn`` and ``skip`` pass; only ``fail`` drains.

    ``error``: the check program itself raised (a bug, or input it could not parse,
    such as a hostile process name). It is logged, journaled and counted, but it is not
    evidence against the node, so it never drains by itself: otherwise any user who can
    make a check crash could drain every node.
    """

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    ERROR = "error"


#: The rungs' record values, cheapest first.
RUNGS: tuple[str, ...] = tuple(r.value for r in Rung)
#: The statuses a ``run_end`` record can carry (a stood-down controller writes none).
RUN_STATUSES: tuple[str, ...] = tuple(s.value for s in RunStatus
                                      if s is not RunStatus.STOOD_DOWN)
#: A health record's statuses.
HEALTH_STATUSES: tuple[str, ...] = tuple(s.value for s in HealthStatus)
