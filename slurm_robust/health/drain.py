"""Drain a node after a failed suite, without ever taking over an admin's drain.

The rule: never overwrite a drain reason someone else set (an admin's note says why a
human took the node out), leave nodes Slurm itself holds (down, ...) to Slurm, and prefix
every reason we set with ``slurm_robust:`` so that ours are told apart (and may be
refreshed).

Deciding is pure (:func:`decide_drain` over the node's current record); acting is one
``scontrol update`` through ``slurm_robust.slurm``. On the prolog's failure path this
costs two Slurm calls (read, then drain): the read is what keeps us from overwriting an
admin's drain reason, and it only happens when the node is already failing a job, so the
"no Slurm calls in the prolog" guidance holds on every job that starts normally.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from slurm_robust.pending_reason import PENDING, PREFIX
from slurm_robust.pending_reason import PENDING_PREFIX as PENDING_PREFIX  # re-exported
from slurm_robust.slurm import Node, Slurm

#: Slurm keeps the reason in a fixed buffer and `sinfo -R` cuts it further: stay short.
REASON_LIMIT = 100


class ReasonKind(StrEnum):
    """What a drain we set means, and so who may return the node to service.

    CHECK: a node check failed on the node itself (prolog, epilog, deep suite).
    PENDING: a job blamed the node, or Slurm marked it DOWN under a job: a suspicion, the
        deep check (run automatically) returns it to service when it passes.
    REPEAT: it failed again soon after a return to service: kept out for an admin.
    """

    CHECK = ""
    PENDING = PENDING
    REPEAT = "repeat offender"


# Tails by which an older reason nested an earlier one inside itself, or a repeat
# offender's "again N h after return": cut, never kept (a new one is added when due).
_NESTING = re.compile(r"\s*(\(before:|[;:,]?\s*failed again|[;:]\s*again \d)")


def _flat(text: str) -> str:
    """One printable line without our prefix, kind marks, or a nested earlier reason."""
    t = " ".join("".join(ch if ch.isprintable() else " " for ch in text or "").split())
    marks = [PREFIX] + [f"{k.value}:" for k in ReasonKind if k.value]
    changed = True
    while changed:
        changed = False
        for mark in marks:
            if t.lower().startswith(mark):
                t, changed = t[len(mark):].strip(), True
    t = _NESTING.split(t, maxsplit=1)[0]
    return t.strip(" ;:,")


def flat_reason(text: str) -> str:
    """``text`` as one flat line without our prefix, kind marks or a nested reason."""
    return _flat(text)


def drain_reason(what: str, evidence: str = "", kind: ReasonKind = ReasonKind.CHECK) -> str:
    """THE format of every drain reason slurm_robust sets (prolog/epilog failures, job
    verdicts, nodes found DOWN under a job, repeat offenders, failed deep checks)::

        slurm_robust: [<kind>: ]<check or class>: <evidence>

    Flat (an earlier reason passed in is stripped of its marks, never nested), one line,
    at most REASON_LIMIT characters (the evidence is cut, the check or class is kept).
    ``what`` may already carry its evidence ("gpu_xid: Xid 79 on GPU 3").
    """
    flat = _flat(what) or "unknown"
    head_what, _, rest = flat.partition(": ")
    head_what = head_what[:48]
    ev = _flat(evidence)
    if ev.lower().startswith(head_what.lower() + ":"):
        ev = ev[len(head_what) + 1:].strip()
    parts = [p for p in (rest.strip(), ev) if p]
    head = f"{PREFIX} " + (f"{kind.value}: " if kind.value else "") + head_what
    text = head + (": " + "; ".join(parts) if parts else "")
    return text[:REASON_LIMIT].rstrip(" ;:,")


def reason_kind(reason: str) -> ReasonKind | None:
    """The kind of one of our drain reasons; None for a reason we did not set."""
    text = (reason or "").strip()
    if not text.startswith(PREFIX):
        return None
    rest = text[len(PREFIX):].strip()
    for kind in (ReasonKind.PENDING, ReasonKind.REPEAT):
        if rest.startswith(f"{kind.value}:"):
            return kind
    return ReasonKind.CHECK
# A pending node whose deep suite, run ON it (slurm_robust.node_deep_check, slurmd's
# HealthCheckProgram), failed: drained with this prefix, kept out for an admin.
DEEP_FAILED_PREFIX = f"{PREFIX} deep check failed:"
# Base states in which we do not touch a node: Slurm (or an admin) already took it out.
HANDS_OFF_STATES = ("down", "future", "unknown")
# Reasons Slurm itself writes on its own failure paths; ours is more precise, replace them.
SLURM_REASONS = ("Prolog error", "Epilog error", "Kill task failed", "Not responding")


@dataclass(frozen=True)
class DrainDecision:
    """``action`` is ``drain`` or ``keep``; ``why`` says which rule decided."""

    action: str
    reason: str
    why: str


def decide_drain(node: Node | None, reason: str, down_too: bool = False) -> DrainDecision:
    """Drain with our reason unless the node is gone, down, or carries someone else's
    drain reason (an admin's note is never overwritten; ours may be refreshed).

    ``down_too``: drain a DOWN node as well (a node a job blamed or that Slurm marked
    DOWN under a job): the DRAIN flag keeps it out when ReturnToService would otherwise
    bring it back unchecked as soon as its slurmd registers again."""
    # Every reason we set goes through the one format (flat, short, our prefix); one
    # already made by drain_reason is kept whole (re-flattening would cut a repeat
    # offender's "again N h after return"), only bounded.
    if reason_kind(reason) is None:
        reason = drain_reason(reason)
    else:
        reason = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
        reason = reason[:REASON_LIMIT]
    if node is None:
        return DrainDecision("keep", reason, "node not found in Slurm")
    if node.state in HANDS_OFF_STATES and not (down_too and node.state == "down"):
        return DrainDecision("keep", reason, f"node is {node.state}; left to Slurm")
    existing = (node.reason or "").strip()
    if (node.drained or node.state == "down") and existing and not existing.startswith(PREFIX) \
            and not existing.startswith(SLURM_REASONS):
        return DrainDecision("keep", reason, f"already drained by {node.reason_user or 'admin'}"
                                             f": {existing!r} kept")
    return DrainDecision("drain", reason, "drained")


def drain_for_failure(node_name: str, reason: str, slurm: Slurm | None = None) -> DrainDecision:
    """Read the node, decide, and drain if the decision says so (SlurmCommandError on a
    Slurm failure)."""
    slurm = slurm or Slurm()
    found = slurm.nodes([node_name])
    decision = decide_drain(found[0] if found else None, reason)
    if decision.action == "drain":
        slurm.drain(node_name, decision.reason)
    return decision
