"""Node failure history: failures, returns to service, repeat offenders (pure functions).

Sources, both read on the controller: Slurm's node events (``sacctmgr show event``: each
drain/down period with its reason, start and end) and, where readable, the nodes' health
journals. A failure is a drain/down period whose reason marks a fault (ours, prefixed
``slurm_robust:``, or one of Slurm's own fault reasons); the end of that period is the
node's return to service. Failures of one node closer together than the replacement
window count once (one drained node, however many records describe it).

A node that fails again within ``repeat_window_h`` of being returned is a repeat
offender: :func:`repeat_offender_reason` gives the drain reason that keeps it out for an
admin. The node-side drain helper and the handoff both call it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_robust.health.drain import ReasonKind, drain_reason

OUR_PREFIX = "slurm_robust:"
REPEAT_MARK = ReasonKind.REPEAT.value
# Reasons Slurm itself sets when a node faults (not an admin's maintenance drain).
SLURM_FAULT_REASONS = ("not responding", "prolog error", "epilog error", "kill task failed",
                       "batch job complete failure", "node unexpectedly rebooted",
                       "nhc:")
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"


@dataclass(frozen=True)
class NodeEvent:
    """``failed`` at ``time`` (with its reason) or ``returned`` to service at ``time``."""

    node: str
    time: float
    kind: str
    detail: str = ""


def is_fault_reason(reason: str) -> bool:
    low = reason.strip().lower()
    return low.startswith(OUR_PREFIX) or any(low.startswith(r) for r in SLURM_FAULT_REASONS)


def _parse_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text.strip(), _SACCT_TIME))
    except ValueError:
        return None  # "Unknown": the period has not ended


def events_from_sacctmgr(raw: str) -> list[NodeEvent]:
    """Parse ``sacctmgr show event format=Cluster,NodeName,Start,End,State,Reason,User``.

    One ``failed`` event per fault period and a ``returned`` event at its end, when it
    has ended. Cluster-wide lines (no node) and non-fault reasons are skipped.
    """
    out: list[NodeEvent] = []
    for line in raw.splitlines():
        parts = line.split("|")
        if len(parts) < 6:
            continue
        node, start, end, reason = parts[1], parts[2], parts[3], parts[5]
        t0 = _parse_time(start)
        if not node or t0 is None or not is_fault_reason(reason):
            continue
        out.append(NodeEvent(node, t0, "failed", reason))
        t1 = _parse_time(end)
        if t1 is not None and t1 > t0:
            out.append(NodeEvent(node, t1, "returned", reason))
    return out


def events_from_health(records: Iterable[dict[str, object]]) -> list[NodeEvent]:
    """Failures from health-journal records: one per failing suite run (``run_id``)."""
    seen: set[tuple[str, str]] = set()
    out: list[NodeEvent] = []
    for r in records:
        if r.get("status") != "fail":
            continue
        node, run = str(r.get("node", "")), str(r.get("run_id", ""))
        t = r.get("time")
        if not node or (node, run) in seen or not isinstance(t, (int, float)):
            continue
        seen.add((node, run))
        out.append(NodeEvent(node, float(t), "failed", str(r.get("reason", ""))))
    return out


def failure_times(events: Iterable[NodeEvent], window_s: float) -> list[float]:
    """Distinct failures: per node, failures within ``window_s`` of the previous count once."""
    by_node: dict[str, list[float]] = {}
    for e in events:
        if e.kind == "failed":
            by_node.setdefault(e.node, []).append(e.time)
    out: list[float] = []
    for times in by_node.values():
        last: float | None = None
        for t in sorted(times):
            if last is None or t - last >= window_s:
                out.append(t)
                last = t
    return sorted(out)


def returns_from_health(records: Iterable[dict[str, object]]) -> list[NodeEvent]:
    """Returns to service from health-journal records: one per ``resume``-stage suite run
    in which no check failed (what ``slurm-robust node resume`` writes before resuming)."""
    runs: dict[tuple[str, str], tuple[float, bool]] = {}
    for r in records:
        if r.get("stage") != "resume":
            continue
        node, run, t = str(r.get("node", "")), str(r.get("run_id", "")), r.get("time")
        if not node or not isinstance(t, (int, float)):
            continue
        last, failed = runs.get((node, run), (0.0, False))
        runs[(node, run)] = (max(last, float(t)), failed or r.get("status") == "fail")
    return [NodeEvent(node, t, "returned", "resume check passed")
            for (node, _), (t, failed) in runs.items() if not failed]


def repeat_offender_reason(node: str, history: Sequence[NodeEvent], now: float,
                           window_s: float, new_reason: str = "") -> str | None:
    """The drain reason for a repeat offender, or None when ``node`` is not one.

    ``node`` is a repeat offender when its newest ``returned`` event lies within
    ``window_s`` before ``now`` and a ``failed`` event precedes that return: it was
    drained, brought back, and fails again too soon.
    """
    mine = sorted((e for e in history if e.node == node and e.time <= now),
                  key=lambda e: e.time)
    returns = [e for e in mine if e.kind == "returned"]
    if not returns:
        return None
    back = returns[-1]
    if now - back.time > window_s:
        return None
    earlier = [e for e in mine if e.kind == "failed" and e.time < back.time]
    if not earlier:
        return None
    hours = (now - back.time) / 3600.0
    # Flat: the new fault and how soon it came back; the earlier reason is in the
    # node's history (sacctmgr events), never nested in this one.
    return drain_reason(new_reason or "failed again", f"again {hours:.1f} h after return",
                        ReasonKind.REPEAT)
