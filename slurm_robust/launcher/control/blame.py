"""What a run says when it blames a node.

Blame from a job is a suspicion: the verdict drains the node "pending deep
check" and the deep suite decides whether it returns. So the verdict's reason is the
flat drain reason of :func:`slurm_robust.health.drain.drain_reason` (kind PENDING): the
fault class and its evidence, never the ladder's wording ("1 node(s) blamed ... but 0
spare(s) left" says nothing about the node). How many nodes one run may blame is the
ladder's last refinement (ladder.capped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_robust.health.drain import ReasonKind, drain_reason, flat_reason

#: How the in-job monitor's eviction text starts (launcher/control/monitor.verdict_reason).
MONITOR_MARK = "in-job monitor on "


def evidence_summary(cls: str, evidence: Mapping[str, Any]) -> str:
    """A few words of evidence for a drain reason (the full evidence is in the verdict)."""
    parts: list[str] = []
    if evidence.get("controller_lost"):
        parts.append("controller heartbeat lost")
    elif "heartbeat_age_s" in evidence:
        try:
            parts.append(f"heartbeat lost {float(evidence['heartbeat_age_s']):.0f}s")
        except (TypeError, ValueError):
            parts.append("heartbeat lost")
    for key in ("diagnosis_reason", "finding"):
        if evidence.get(key):
            parts.append(flat_reason(str(evidence[key])))
    if not parts:
        if evidence.get("signal") is not None:
            parts.append(f"signal {evidence['signal']}")
        elif evidence.get("exit_code") is not None:
            parts.append(f"exit {evidence['exit_code']}")
        if evidence.get("line"):
            parts.append(str(evidence["line"])[:60])
    return "; ".join(parts) or cls


def verdict_reason(cls: str, evidence: Mapping[str, Any], extra: str | None = None) -> str:
    """The verdict (and direct drain) reason for a node this run blames:
    ``slurm_robust: pending deep check: <class>: <evidence>``. ``extra`` (a monitor's
    finding) is evidence that names the check, so it goes first."""
    summary = evidence_summary(cls, evidence)
    if extra and extra.startswith(MONITOR_MARK):
        # "in-job monitor on <node>: <check>: <evidence>": the node is the drained one.
        extra = extra.split(": ", 1)[-1]
    if extra:
        extra = flat_reason(extra)
        summary = f"{extra}; {summary}" if summary != cls else extra
    return drain_reason(cls, summary, ReasonKind.PENDING)
