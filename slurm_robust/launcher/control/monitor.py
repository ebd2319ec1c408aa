"""The controller's side of the in-job monitor: findings and implicit signals.

The agents' monitors (node/monitor.py) send :class:`Finding` records and a
:class:`NodeSample` in their reports. Here, under the recovery owner:

- every finding becomes a ``finding`` event in the run's event log (docs/SCHEMAS.md) and
  is counted per node and severity, so the post-mortem shows what was seen before an
  incident;
- a fatal finding from an active node waits in :class:`NodeFindings` until the recovery
  owner's tick turns it into an incident (:func:`incident_of`) that takes the ladder like
  a lost node (the node is blamed: spare, else requeue without it), with the check and
  its evidence in the verdict;
- the samples feed two implicit signals, for scripts that report nothing themselves:
  a per-generation :class:`FailSlowMonitor` fed with a GPU-derived slowness (a node whose
  GPU utilisation or SM clock falls against the others' median looks slow), and an idle
  hang (no step for the hang timeout while every active node's GPUs are idle or its
  RDMA ports silent, after it was seen busy), :meth:`NodeFindings.idle_hang`.
"""

from __future__ import annotations

import statistics
from collections import Counter, deque
from dataclasses import dataclass
from typing import TypedDict

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import failslow
from slurm_robust.launcher.control.events import EventLog, new_incident
from slurm_robust.launcher.enums import Category, Severity
from slurm_robust.launcher.messages import Finding, Incident, NodeSample
from slurm_robust.stacks.failslow import FailSlowMonitor

EVENT = "finding"
#: Version of the finding event's own fields (beside the event log's ``v``), so a reader
#: can tell a later payload change apart.
FINDING_VERSION = 1
#: Samples kept per node (about 10 minutes at the default 10 s).
SAMPLES_KEPT = 64
#: GPU utilisation (percent) at or below which a GPU counts as idle.
IDLE_UTIL = 1.0
#: RDMA bytes per second at or below which a node's ports count as silent (management
#: traffic such as subnet-manager queries stays far below a collective's).
SILENT_RDMA_BPS = 64 * 1024.0


class IdleHang(TypedDict):
    """The in-job monitor's evidence of an implicit hang: why each node counts as idle
    (``gpus_idle``, ``rdma_silent``) and for how long."""

    implicit_hang: dict[str, str]
    idle_for_s: float


@dataclass
class PendingFatal:
    node: str
    agent: int
    finding: Finding
    seen: float


class NodeFindings:
    """Findings and samples of the run's agents (owned by the recovery owner)."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.counts: Counter[tuple[str, str]] = Counter()
        self.pending: list[PendingFatal] = []
        self.samples: dict[str, deque[NodeSample]] = {}
        self.gpu_failslow: FailSlowMonitor | None = None
        self._rank_nodes: list[str] = []

    # ------------------------------------------------------------------ input
    def on_report(self, node: str, agent: int, findings: list[Finding],
                  sample: NodeSample | None, active: bool, now: float) -> None:
        for f in findings:
            self.counts[(node, f.severity.value)] += 1
            self.events.emit(EVENT, {"finding_version": FINDING_VERSION,
                                     "node": node, "agent": agent, "kind": f.kind,
                                     "check": f.check, "severity": f.severity.value,
                                     "class": f.cls, "reason": f.reason,
                                     "seen_at": f.time, "evidence": f.evidence}, now=now)
            if f.severity is Severity.FATAL and active:
                self.pending.append(PendingFatal(node, agent, f, now))
        if sample is not None:
            kept = self.samples.setdefault(node, deque(maxlen=SAMPLES_KEPT))
            if not kept or kept[-1].time != sample.time:
                kept.append(sample)
                self._feed_failslow(node, sample, now)

    def new_generation(self, cfg: RunConfig, rank_nodes: list[str]) -> None:
        """A new worker group: fresh GPU fail-slow vote; fatal findings of nodes that left
        the group are dropped (they are evicted already)."""
        self._rank_nodes = list(rank_nodes)
        self.gpu_failslow = failslow.new_monitor(cfg, rank_nodes)
        self.pending = [p for p in self.pending if p.node in set(rank_nodes)]

    def take_fatal(self, active_agents: set[int]) -> PendingFatal | None:
        """The earliest fatal finding of an active agent, removed with the rest of that
        node's pending ones (one incident per node)."""
        mine = [p for p in self.pending if p.agent in active_agents]
        if not mine:
            self.pending = []
            return None
        first = min(mine, key=lambda p: p.finding.time)
        self.pending = [p for p in self.pending if p.node != first.node]
        return first

    # ------------------------------------------------------------------ implicit signals
    def _feed_failslow(self, node: str, sample: NodeSample, now: float) -> None:
        """A GPU-derived slowness per rank of ``node``: the others' median over this
        node's reading (utilisation times SM clock), so 2.0 means half as fast."""
        mon = self.gpu_failslow
        if mon is None or node not in self._rank_nodes:
            return
        score = _gpu_score(sample)
        if score is None:
            return
        scores = [s for n in set(self._rank_nodes)
                  if (s := _gpu_score(self.latest(n))) is not None]
        if len(scores) < 2:
            return
        med = statistics.median(scores)
        slowness = med / max(score, 1e-6)
        for rank, rank_node in enumerate(self._rank_nodes):
            if rank_node == node:
                mon.record(rank, slowness, now)

    def latest(self, node: str) -> NodeSample | None:
        kept = self.samples.get(node)
        return kept[-1] if kept else None

    def idle_hang(self, nodes: list[str], since: float, now: float,
                  timeout_s: float) -> IdleHang | None:
        """Evidence of an implicit hang, or None: for ``timeout_s`` up to ``now`` (and
        after ``since``, the last progress) every node was idle -- its GPUs idle, or its
        RDMA ports silent (ByteRobust's zero-RDMA rule) -- and each was seen busy the same
        way before (so a job still loading is not a hang).

        Only RDMA ports count as the job's network: ordinary interfaces carry other
        traffic (or none, when the job talks over loopback), so their silence is no
        evidence and a script that reports no steps is never killed for it."""
        if not nodes or now - since < timeout_s:
            return None
        evidence: dict[str, str] = {}
        for node in nodes:
            kept = list(self.samples.get(node, ()))
            window = [s for s in kept if s.time >= now - timeout_s]
            before = [s for s in kept if s.time < now - timeout_s]
            if not window or not before:
                return None
            if _quiet_after_busy(window, before, "gpu_util", IDLE_UTIL):
                evidence[node] = "gpus_idle"
            elif _quiet_after_busy(window, before, "rdma_bytes_per_s", SILENT_RDMA_BPS):
                evidence[node] = "rdma_silent"
            else:
                return None
        return {"implicit_hang": evidence, "idle_for_s": round(timeout_s, 3)}


def _quiet_after_busy(window: list[NodeSample], before: list[NodeSample], field: str,
                      quiet_at: float) -> bool:
    """Every reading of ``field`` in the window at or below ``quiet_at`` (none missing),
    and some reading before it above."""
    now_vals = [getattr(s, field) for s in window]
    if any(v is None for v in now_vals):
        return False
    return all(v <= quiet_at for v in now_vals) and any(
        (v := getattr(s, field)) is not None and v > quiet_at for s in before)


def _gpu_score(sample: NodeSample | None) -> float | None:
    if sample is None or sample.gpu_util is None:
        return None
    clock = sample.sm_clock_mhz if sample.sm_clock_mhz else 1.0
    return max(sample.gpu_util, 0.0) * clock


def incident_of(pending: PendingFatal, incident_id: str, last_step: int | None,
                ranks: list[int], now: float) -> Incident:
    """The incident for a fatal finding: its class, the node, the check and its evidence;
    the fault time is when the node saw it, detected when the controller heard of it."""
    f = pending.finding
    evidence = {"monitor": {"check": f.check, "kind": f.kind, "reason": f.reason,
                            "seen_at": f.time, **f.evidence}}
    incident = new_incident(incident_id, str(f.cls), Category.EXPLICIT, pending.seen,
                            fault_time=f.time, nodes=[pending.node], ranks=ranks,
                            last_step=last_step, evidence=evidence)
    incident.localized_at = now
    return incident


def verdict_reason(pending: PendingFatal) -> str:
    return f"in-job monitor on {pending.node}: {pending.finding.reason}"
