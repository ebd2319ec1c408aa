"""Stop-time diagnosis (ByteRobust's EUD) as seen by recovery: whether an unclear crash
is diagnosed before a node is blamed, and what the diagnosis concluded.

Pure: the applier asks the node's agent (phase ``diagnosing``, docs/ARCHITECTURE.md),
the ``diagnosing`` handler (detectors.py) waits, and the applier applies
:class:`Conclusion` (the incident's evidence, its localisation, a
cleared signature) before running the ladder with ``diagnosis_failed``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from slurm_robust.launcher.control.generation import Failure, PendingDiagnosis
from slurm_robust.launcher.control.policy import blamed_nodes, unexplained_repeats
from slurm_robust.launcher.messages import DiagnosisReport
from slurm_robust.launcher.wire_records import FailedCheck
from slurm_robust.taxonomy import ROWS, Action, canonical

#: Longest wait for a stop-time diagnosis: launcher/diagnose.py's own budget, plus the
#: agent's stopping its workers and a few reports' worth of slack.
DIAGNOSIS_WAIT_S = 45.0


def wants_diagnosis(root: Failure, node_failures: Mapping[str, int], threshold: int,
                    passed: Collection[str], agent_can_answer: bool) -> bool:
    """Diagnose when no node is blamed yet, the failure's signature has not passed a
    diagnosis before, its agent can still answer, and either the failure's action is
    ``diagnose`` or it is a repeat that is no evidence against the node by itself (a
    user-side, unknown or off-node class whose count on the node reached ``threshold``:
    only the node's own checks may blame it)."""
    ex = root.exit
    cls_name = str(ex.cls)
    side = ex.side.value if ex.side is not None else None
    action = ex.action
    if action is None:  # an older agent: the class's default action
        cls = canonical(cls_name)
        action = ROWS[cls].action if cls is not None else None
    if diagnosed_before(ex.signature, passed):
        return False
    failures = {**node_failures, root.node: node_failures.get(root.node, 0) + 1}
    if blamed_nodes(cls_name, [root.node], failures, threshold, side):
        return False
    unexplained = unexplained_repeats(cls_name, [root.node], failures, threshold, side)
    if action is not Action.DIAGNOSE and not unexplained:
        return False
    return agent_can_answer


def diagnosed_before(signature: str | None, passed: Collection[str]) -> bool:
    return signature is not None and signature in passed


class DiagnosisOutcome(TypedDict, total=False):
    """An incident's ``evidence.diagnosis``: the agent's answer (DiagnosisEvidence) with
    its ``id`` and ``reason``, or, when none came, the ``id``, the ``node`` and why not
    (``answer``)."""

    id: str
    node: str
    answer: str
    reason: str
    passed: bool
    complete: bool
    elapsed_s: float
    budget_s: float
    failed: list[FailedCheck]
    ran: list[str]


class ConclusionEvidence(TypedDict, total=False):
    diagnosis: DiagnosisOutcome
    diagnosis_reason: str  # a failed diagnosis's reason, for a reader of the top level


@dataclass(frozen=True)
class Conclusion:
    """What a finished (or abandoned) diagnosis says. ``evidence``: keys for the
    incident's evidence, in order; ``localized_at``: when the node's checks named it;
    ``failed``: the node is blamed; ``passed``: the node answered and passed (a repeat
    that is no evidence against it then stops the run, ladder.unexplained_repeat);
    ``cleared``: a signature that passed a complete diagnosis (the same error again is
    not the node's)."""

    evidence: ConclusionEvidence = field(default_factory=ConclusionEvidence)
    localized_at: float | None = None
    failed: bool = False
    cleared: str | None = None
    passed: bool = False


def conclude(pending: PendingDiagnosis, answer: DiagnosisReport | None, lost: bool,
             now: float) -> Conclusion | None:
    """The diagnosis's conclusion, or None while it is still worth waiting for."""
    if answer is None and not lost and now < pending.deadline:
        return None
    if answer is None:
        return Conclusion({"diagnosis": {"id": pending.id, "node": pending.node,
                                         "answer": "agent lost" if lost else
                                         f"no answer within {DIAGNOSIS_WAIT_S:g} s"}},
                          failed=lost)  # a node that vanished while checking itself
    evidence: ConclusionEvidence = {"diagnosis": {**answer.evidence, "id": answer.id,
                                                  "reason": answer.reason}}
    if not answer.passed:
        evidence["diagnosis_reason"] = answer.reason
    cleared = pending.signature if answer.passed and answer.complete else None
    # Localisation is the diagnosis: detected + the time the node's checks took.
    return Conclusion(evidence, pending.incident.detected_at + answer.elapsed_s,
                      failed=not answer.passed, cleared=cleared or None,
                      passed=answer.passed)
