"""Applying reserve actions through the Slurm access layer, and logging every one.

The one place where the reserve changes Slurm state: :mod:`.plan` decides in pure
functions, this module acts. Every action's
outcome is appended to the reserve log as a ``slurm_robust.reserve_action`` record
(docs/SCHEMAS.md, verdict section). Callers hold the reserve lock.

Partition moves add a node to its destination before removing it from its source, so a
node is never in no partition; all moves of one plan are batched into one
``scontrol update PartitionName=...`` per partition, computed from the partitions'
membership read just before (not from the older snapshot).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health import decide_drain
from slurm_robust.health.breaker import BreakerUnavailable, DrainBreaker
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.records import append_records, make_record
from slurm_robust.reserve.config import SHARED_FILE_MODE
from slurm_robust.reserve.gate import DeepRun, HealthGate
from slurm_robust.reserve.plan import OUR_PREFIX, Action, DeepCheck, Drain, Move, Note
from slurm_robust.slurm import Slurm

log = logging.getLogger("slurm_robust.reserve")

ACTION_SCHEMA = "slurm_robust.reserve_action"
ACTION_VERSION = 1


class Executor:
    """Applies actions; returns and logs one outcome dict per action.

    Args:
        slurm: the access layer.
        gate: runs deep suites (DeepCheck actions).
        log_path: the reserve log (JSON lines).
        op: ``reconcile`` or ``handoff``, recorded with every outcome.
        dry_run: log what would be done, change nothing.
        breaker: the drain circuit breaker (health/breaker.py) asked before each drain.
        record: takes the node-ledger events of each apply (drains, held-back drains,
            deep checks); it must never raise (health.ledger_writer.record_safely).
    """

    def __init__(self, slurm: Slurm, gate: HealthGate, log_path: Path, op: str,
                 dry_run: bool = False, clock: Callable[[], float] = time.time,
                 breaker: DrainBreaker | None = None,
                 record: Callable[[list[NodeEvent]], Any] | None = None) -> None:
        self.slurm = slurm
        self.gate = gate
        self.log_path = log_path
        self.op = op
        self.dry_run = dry_run
        self.clock = clock
        #: The drain circuit breaker every drain asks first (None: off or no site config).
        self.breaker = breaker
        self.record = record
        self._events: list[NodeEvent] = []

    def apply(self, actions: Sequence[Action]) -> list[dict[str, Any]]:
        outcomes: list[dict[str, Any]] = []
        self._events = []
        for action in actions:
            if isinstance(action, Drain):
                outcomes.append(self._drain(action))
            elif isinstance(action, DeepCheck):
                outcomes.append(self._deep_check(action))
            elif isinstance(action, Note):
                outcomes.append(self._outcome(action, ok=True))
        moves = [a for a in actions if isinstance(a, Move)]
        if moves:
            outcomes.extend(self._moves(moves))
        if outcomes:
            append_records(self.log_path, [make_record(ACTION_SCHEMA, ACTION_VERSION, o,
                                                       now=o["time"]) for o in outcomes],
                           mode=SHARED_FILE_MODE)
        if self._events and self.record is not None and not self.dry_run:
            self.record(self._events)
        return outcomes

    def _event(self, kind: EventKind, node: str, job_id: str | None = None,
               **evidence: Any) -> None:
        self._events.append(NodeEvent(node, kind, f"reserve {self.op}", self.clock(), job_id,
                                      evidence=evidence))

    def _outcome(self, action: Action, ok: bool, error: str = "",
                 **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "action": action.kind, "node": action.node,
                               "why": action.why, "ok": ok, "error": error,
                               "dry_run": self.dry_run, "time": self.clock()}
        if isinstance(action, Move):
            out.update(src=list(action.src), dst=action.dst)
        if isinstance(action, Drain):
            out["reason"] = action.reason
        if isinstance(action, Drain | Note):
            out["job_id"] = action.job_id
        out.update(extra)
        if not ok:
            log.warning("reserve %s %s %s failed: %s", self.op, action.kind, action.node, error)
        return out

    def _drain(self, action: Drain) -> dict[str, Any]:
        """Drain through the health feature's rule (practice 3), on a fresh read of the node:
        never over an admin's reason, never a down node."""
        try:
            found = self.slurm.nodes([action.node])
            decision = decide_drain(found[0] if found else None, action.reason,
                                    down_too=action.down_too)
            if decision.action != "drain":
                return self._outcome(action, ok=True, skipped=decision.why)
            if not self.dry_run and self.breaker is not None:
                try:
                    claim = self.breaker.claim(action.node, decision.reason,
                                               f"reserve {self.op}")
                except BreakerUnavailable as exc:
                    log.warning("reserve %s: drain circuit breaker not asked: %s", self.op, exc)
                else:
                    if not claim.granted:
                        self._event(EventKind.WOULD_DRAIN, action.node, action.job_id,
                                    reason=decision.reason, why=claim.why)
                        return self._outcome(action, ok=True, skipped=claim.why)
            if not self.dry_run:
                self.slurm.drain(action.node, decision.reason)
                self._event(EventKind.DRAIN, action.node, action.job_id,
                            reason=decision.reason, why=action.why)
        except SlurmRobustError as exc:
            return self._outcome(action, ok=False, error=str(exc))
        return self._outcome(action, ok=True)

    def _deep_check(self, action: DeepCheck) -> dict[str, Any]:
        if self.dry_run:
            return self._outcome(action, ok=True, passed=None)
        try:
            run: DeepRun = self.gate.run_deep(action.node)
        except SlurmRobustError as exc:
            return self._outcome(action, ok=False, error=str(exc))
        if not run.ran:
            return self._outcome(action, ok=False, error=run.reason, passed=None)
        extra: dict[str, Any] = {"passed": run.passed, "reason": run.reason}
        self._event(EventKind.DEEP_CHECK_PASSED if run.passed else EventKind.DEEP_CHECK_FAILED,
                    action.node, reason=run.reason, why=action.why)
        if not run.passed:
            # A failed deep check drains the node: drained nodes never enter the reserve.
            reason = run.reason if run.reason.startswith(OUR_PREFIX) else \
                f"{OUR_PREFIX} {run.reason}"
            drained = self._drain(Drain(action.node, reason, "deep check failed"))
            extra["drained"] = drained["ok"] and "skipped" not in drained
            extra["drain_error"] = drained["error"]
        return self._outcome(action, ok=True, **extra)

    def _moves(self, moves: Sequence[Move]) -> list[dict[str, Any]]:
        dsts = sorted({m.dst for m in moves})
        srcs = sorted({p for m in moves for p in m.src})
        try:
            current = {p: self.slurm.partition_nodes(p) for p in {*dsts, *srcs}}
            for part in dsts:  # add first: a node is never in no partition
                adds = [m.node for m in moves if m.dst == part and m.node not in current[part]]
                self._set(part, current[part] + adds, current[part])
                current[part] = current[part] + adds
            for part in srcs:
                gone = {m.node for m in moves if part in m.src and m.dst != part}
                self._set(part, [n for n in current[part] if n not in gone], current[part])
        except SlurmRobustError as exc:
            return [self._outcome(m, ok=False, error=str(exc)) for m in moves]
        return [self._outcome(m, ok=True) for m in moves]

    def _set(self, partition: str, new: list[str], old: list[str]) -> None:
        if new == old or self.dry_run:
            return
        log.info("partition %s: %s -> %s", partition, ",".join(old), ",".join(new))
        self.slurm.set_partition_nodes(partition, new)
