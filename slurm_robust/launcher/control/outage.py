"""An external service down at start-up: the backoff and the budget, as pure functions.

A worker group that fails before its first step with an off-node service class
(``external_service``: a model hub, an API; ``remote_storage``: an object store, a
shared file system's server) is not the training's fault and not the node's: restarting
it at once only fails again until the service is back. Such a failure does not count
against ``max_no_progress`` or ``max_restarts``; the ladder (ladder.py) restarts in place
after a backoff (``outage_backoff_s`` doubling up to ``outage_backoff_max_s``,
deterministic: no jitter) until the outage has lasted ``outage_budget_s``, then stops
with a verdict that names the service as the classifier saw it. A failure of another
class, a time limit excepted, or any finished step ends the outage (the clock and the
backoff start over at the next one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurm_robust.launcher.enums import IncidentClass

#: The classes whose start-up failures are waited out rather than counted.
OUTAGE_CLASSES = frozenset({IncidentClass.EXTERNAL_SERVICE, IncidentClass.REMOTE_STORAGE})

_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>),\]]+", re.IGNORECASE)
_HOST = re.compile(r"host=['\"]([^'\"]+)['\"]")
_NAMED = re.compile(r"\b(?:[a-z0-9-]+\.)+(?:co|com|ai|io|org|net)\b", re.IGNORECASE)


def startup_outage(cls: str, progressed: bool) -> bool:
    """Whether a failure of class ``cls`` is a service outage at start-up: an off-node
    service class, in an attempt that made no progress (no step finished)."""
    return not progressed and cls in OUTAGE_CLASSES


def backoff_s(failures: int, first_s: float, max_s: float) -> float:
    """The wait before restarting after the ``failures``-th start-up failure in a row of
    one outage (1: the first): ``first_s`` doubling each time, at most ``max_s``."""
    if failures < 1:
        return 0.0
    return min(max_s, first_s * 2.0 ** min(failures - 1, 64))


def service_of(evidence: Mapping[str, Any], line: str | None = None) -> str:
    """The service as the classifier saw it: the host or URL its matched line names,
    then the line itself (``evidence.classifier.line``, else the exit's ``line``)."""
    why = evidence.get("classifier")
    seen = why.get("line") if isinstance(why, Mapping) else None
    text = str(seen or line or evidence.get("line") or "").strip()
    if not text:
        return "no line matched (see the rank's log)"
    found = _HOST.search(text) or _URL.search(text) or _NAMED.search(text)
    where = (found.group(1) if found.re is _HOST else found.group(0)) if found else None
    text = text[:200]
    return f"{where}: {text}" if where and where != text else text


def outage_verdict(cls: str, lasted_s: float, failures: int, budget_s: float,
                   service: str | None) -> str:
    """The stop reason once the outage budget is spent: the service, for how long."""
    what = "remote storage" if cls == IncidentClass.REMOTE_STORAGE else "external service"
    return (f"{what} unreachable for {minutes(lasted_s)}: {service or cls} "
            f"({failures} start-up attempt(s) failed with {cls}; outage budget "
            f"{minutes(budget_s)}); no node is blamed: resubmit once the service is back, "
            "or raise --outage-budget")


def minutes(seconds: float) -> str:
    """``31 min`` (whole minutes, rounded up), or ``45 s`` under a minute."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{-(-int(seconds) // 60)} min"


@dataclass(frozen=True)
class Backoff:
    """A restart in place held back (an external service's outage at start-up,
    outage.py): the generation starts on ``slots`` no earlier than ``not_before``. The
    agents of the slots hold (workers stopped) meanwhile; the controller's tick goes on
    answering them and checks the time (detectors.py), it never sleeps."""

    slots: tuple[int, ...]
    not_before: float
