"""A hang's incident from its stack capture: who is stuck, and the evidence.

Pure of the run's state: a detector (detectors.py) decides when a capture is done
(every live agent answered, or the budget ran out) and the applier runs the ladder; this
module reads
the captured stacks and the agents' process states and builds the ``job_hang``
incident.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from slurm_robust.launcher.control.events import new_incident
from slurm_robust.launcher.control.generation import Generation, HangLimit, Member
from slurm_robust.launcher.enums import Category, IncidentClass
from slurm_robust.launcher.messages import Incident
from slurm_robust.stacks.analyze import analyze
from slurm_robust.stacks.dumps import read_capture


class CaptureAnalysis(TypedDict):
    """What grouping the captured stacks said (slurm_robust.stacks.analyze)."""

    verdict: str
    reason: str
    outlier_ranks: list[int]
    nodes: list[str]


class HangEvidence(TypedDict, total=False):
    """A ``job_hang`` incident's evidence (docs/SCHEMAS.md): the capture, how long no
    step came, each agent's process states, and what pointed at whom. ``implicit_hang``
    and ``idle_for_s`` come from the monitor (control/monitor.IdleHang) when it was the
    one that declared the hang; ``analysis_error`` replaces ``analysis`` when the
    capture could not be read."""

    stacks: str
    no_step_for_s: float
    captured_nodes: list[str]
    process_states: dict[str, dict[str, str | None]]
    implicit_hang: dict[str, str]
    idle_for_s: float
    hang_limit: HangLimit
    analysis_error: str
    analysis: CaptureAnalysis
    stopped_ranks: list[int]


def capture_incident(incident_id: str, gen: Generation, views: Sequence[Member],
                     stacks_dir: Path, last_step: int | None, now: float) -> Incident:
    """The hang of ``gen`` as an incident; ``views``: its live agents."""
    done = [v for v in views if gen.capture in v.stacks]
    capture = stacks_dir / str(gen.capture)
    evidence: HangEvidence = {"stacks": str(capture),
                                "no_step_for_s": round(now - gen.last_progress, 3),
                                "captured_nodes": sorted(v.node for v in done),
                                "process_states": {v.node: v.states for v in views}}
    if gen.hang_signal:
        evidence.update(gen.hang_signal)
    if gen.hang_limit:
        evidence["hang_limit"] = gen.hang_limit.copy()
    nodes, ranks = analyze_capture(capture, evidence)
    stopped = {int(r): v.node for v in views for r, s in v.states.items() if s == "T"}
    if stopped:
        # A worker in state T (stopped) cannot make progress: the plainest suspect.
        # It outranks the stack grouping, which needs a clear majority to name anyone.
        evidence["stopped_ranks"] = sorted(stopped)
        ranks, nodes = sorted(stopped), sorted(set(stopped.values()))
    incident = new_incident(incident_id, IncidentClass.JOB_HANG, Category.IMPLICIT,
                            gen.hang_detected or now, fault_time=gen.last_progress,
                            nodes=nodes, ranks=ranks, last_step=last_step,
                            evidence=evidence)
    incident.localized_at = now
    return incident


def analyze_capture(capture: Path, evidence: HangEvidence) -> tuple[list[str], list[int]]:
    """Group the captured stacks; the minority groups are the suspects (evidence only:
    a hang is restarted in place, the suspects' nodes are named in the incident)."""
    try:
        result = analyze(read_capture(capture))
    except Exception as exc:  # noqa: BLE001 - analysis is evidence, never a blocker
        evidence["analysis_error"] = f"{type(exc).__name__}: {exc}"
        return [], []
    evidence["analysis"] = {"verdict": result.verdict, "reason": result.reason,
                            "outlier_ranks": list(result.outlier_ranks),
                            "nodes": result.nodes}
    return result.nodes, list(result.outlier_ranks)
