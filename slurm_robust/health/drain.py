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

from dataclasses import dataclass

from slurm_robust.slurm import Node, Slurm

PREFIX = "slurm_robust:"
# A node blamed by a job (or found down under one) waits drained with this reason until
# the deep suite has run ON it (slurm_robust.node_deep_check, slurmd's HealthCheckProgram):
# returned to service when it passes, drained with DEEP_FAILED_PREFIX when it does not.
PENDING_PREFIX = "slurm_robust: pending deep check:"
DEEP_FAILED_PREFIX = "slurm_robust: deep check failed:"
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


def decide_drain(node: Node | None, reason: str) -> DrainDecision:
    """Drain with our reason unless the node is gone, down, or carries someone else's
    drain reason (an admin's note is never overwritten; ours may be refreshed)."""
    if not reason.startswith(PREFIX):
        reason = f"{PREFIX} {reason}"
    if node is None:
        return DrainDecision("keep", reason, "node not found in Slurm")
    if node.state in HANDS_OFF_STATES:
        return DrainDecision("keep", reason, f"node is {node.state}; left to Slurm")
    existing = (node.reason or "").strip()
    if node.drained and existing and not existing.startswith(PREFIX) \
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
