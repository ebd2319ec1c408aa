"""The bitwise test's controller side: ask, collect, compare.

When a NaN moves between replays (suspected silent data corruption), the controller
asks every rank of the next attempt to run the fixed reference step at its start
(``<run_dir>/nan/bitwise.json``, node/reference_step.py) and compares the digests bit
for bit. The majority digest (counted by node) is the reference; a node with any rank
that differs is the faulty one, evicted with every digest as the evidence.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from slurm_robust.launcher.messages import Incident
from slurm_robust.launcher.nan_files import BITWISE_FILE, NAN_FILES_VERSION, nan_dir
from slurm_robust.records import write_json_atomic

#: Longest wait for every rank's digest before the test counts as incomplete.
BITWISE_WAIT_S = 60.0


@dataclass
class BitwiseRequest:
    """A pending test: its id, the attempt that runs it, and the NaN incident it serves."""

    id: str
    attempt: int
    incident: Incident
    asked_at: float


class BitwiseEvidence(TypedDict, total=False):
    """What the test found, as it goes into the NaN incident's ``evidence.nan.bitwise``
    (docs/SCHEMAS.md): each rank's digest (16 hex digits), the majority's, the nodes off
    it, and the result in words."""

    digests: dict[str, str]
    reference: str
    differing_nodes: list[str]
    result: str


@dataclass(frozen=True)
class BitwiseResult:
    reference: str | None
    differing: tuple[str, ...]
    evidence: BitwiseEvidence

    @property
    def passed(self) -> bool:
        return not self.differing


def request(run_dir: str | Path, attempt: int, incident: Incident,
            now: float | None = None) -> BitwiseRequest:
    now = time.time() if now is None else now
    req = BitwiseRequest(f"{incident.incident}-a{attempt}", attempt, incident, now)
    write_json_atomic(nan_dir(run_dir) / BITWISE_FILE,
                      {"v": NAN_FILES_VERSION, "id": req.id, "attempt": attempt,
                       "time": now}, mode=0o600)
    return req


def compare(digests: Mapping[int, str], rank_nodes: Sequence[str]) -> BitwiseResult:
    """Majority digest by node; nodes with a rank off it differ. A tie names nobody."""
    by_node: dict[str, set[str]] = {}
    for rank, digest in digests.items():
        node = rank_nodes[rank] if 0 <= rank < len(rank_nodes) else f"rank{rank}"
        by_node.setdefault(node, set()).add(digest)
    votes = Counter(d for ds in by_node.values() for d in ds)
    ranked = votes.most_common()
    evidence: BitwiseEvidence = {
        "digests": {str(r): d[:16] for r, d in sorted(digests.items())}}
    if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
        evidence["result"] = "no majority: nobody named"
        return BitwiseResult(None, (), evidence)
    reference = ranked[0][0]
    differing = tuple(sorted(n for n, ds in by_node.items() if ds != {reference}))
    evidence["reference"] = reference[:16]
    evidence["differing_nodes"] = list(differing)
    evidence["result"] = "differ" if differing else "all identical"
    return BitwiseResult(reference, differing, evidence)
