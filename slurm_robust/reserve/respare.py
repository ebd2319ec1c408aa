"""Replace a handed-over spare that fails its prolog.

A spare moved into a job's partition by the handoff can fail the job's prolog: the
prolog drains it (a CHECK reason, or Slurm's "Prolog error") and Slurm requeues the job
(``nohold_on_prolog_fail``). That job end leaves no verdict file (the launcher never
started), so the handoff's verdict path does not run. This module does, for jobs that
were handed spares before (their root-owned ledger exists: one ``stat``, no Slurm call
for every other job): each handed-over spare now drained by a check is recorded as
failed and replaced from the reserve, at most ``reserve.spare_retries`` times per job.

When nothing can replace it (retries spent, reserve empty) and the job's partition no
longer has enough usable nodes for it, the job would pend for ever behind drained nodes:
it is stopped with a verdict instead (its Comment says why, then it is cancelled, once it
has left COMPLETING). Otherwise it runs on what is left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.health.drain import ReasonKind, reason_kind
from slurm_robust.reserve.config import ReserveConfig
from slurm_robust.reserve.executor import Executor
from slurm_robust.reserve.gate import HealthGate
from slurm_robust.reserve.ledger import JobLedger
from slurm_robust.reserve.plan import Move, spares
from slurm_robust.reserve.reconcile import take_snapshot
from slurm_robust.slurm import Job, Node, Slurm

#: Slurm's own reason when a prolog fails without setting one of ours.
PROLOG_ERROR = "Prolog error"


def failed_check(node: Node) -> bool:
    """Drained because a node check failed on it (not a job's suspicion, not an admin);
    a repeat offender's reason wraps a failed check too (the prolog's repeat rule)."""
    if not node.drained:
        return False
    return reason_kind(node.reason) in (ReasonKind.CHECK, ReasonKind.REPEAT) \
        or node.reason.startswith(PROLOG_ERROR)


@dataclass
class Respare:
    """What one job end did about failed spares."""

    failed: list[str] = field(default_factory=list)
    replaced_by: list[str] = field(default_factory=list)
    shortfall: int = 0
    stop_reason: str | None = None
    outcomes: list[dict[str, Any]] = field(default_factory=list)


def replace_failed_spares(job_id: str, partition: str, job: Job | None, requeued: bool,
                          ledger: JobLedger, cfg: ReserveConfig, slurm: Slurm,
                          gate: HealthGate, now: float,
                          clock: Callable[[], float],
                          lemons: frozenset[str] = frozenset()) -> Respare | None:
    """Find the job's handed-over spares that failed a check and replace them (call under
    the reserve lock; updates ``ledger``). None when no spare of this job failed."""
    watched = [n for n in (*ledger.handed_over, *ledger.replacements)
               if n not in ledger.spare_failed]
    if not watched:
        return None
    failed = [n.name for n in slurm.nodes(watched) if failed_check(n)]
    if not failed:
        return None
    out = Respare(failed=failed)
    ledger.spare_failed += failed
    if not requeued or not partition:
        return out
    room = max(cfg.spare_retries - len(ledger.replacements), 0)
    want = min(len(failed), room)
    snap = take_snapshot(slurm, gate, cfg, now, [partition], lemons)
    moves = [Move(name, (cfg.partition,), partition,
                  f"replaces spare(s) {', '.join(failed)} that failed a check for job "
                  f"{job_id} (try {len(ledger.replacements) + i + 1} of {cfg.spare_retries})")
             for i, name in enumerate(spares(snap, cfg)[:want])]
    out.outcomes = Executor(slurm, gate, cfg.log_file, "handoff", clock=clock).apply(moves)
    out.replaced_by = [o["node"] for o in out.outcomes if o["action"] == "move" and o["ok"]]
    ledger.replacements += out.replaced_by
    out.shortfall = len(failed) - len(out.replaced_by)
    if out.shortfall and job is not None:
        usable = [n for n in slurm.nodes(slurm.partition_nodes(partition)) if n.usable]
        if len(usable) < job.node_count:
            why = ("retries spent" if room < len(failed) else "no fresh spare in the reserve")
            out.stop_reason = (f"slurm_robust: stopped: spare(s) {', '.join(failed)} failed "
                               f"a check, {why}; partition {partition} has {len(usable)} "
                               f"usable node(s), the job needs {job.node_count}")
    return out


def stop_when_requeued(slurm: Slurm, job_id: str, reason: str, timeout_s: float,
                       clock: Callable[[], float], sleep: Callable[[float], None],
                       poll_s: float = 0.5) -> str:
    """Put ``reason`` in the job's Comment and cancel it once it has left COMPLETING
    (bounded by ``timeout_s``); returns what happened. Run detached from the epilog."""
    deadline = clock() + timeout_s
    while clock() < deadline:
        job = slurm.job(job_id)
        if job is None or job.finished or job.running:
            return f"job is {job.state if job else 'gone'}; not stopped"
        if job.state != "COMPLETING":
            slurm.update_job(job_id, Comment=reason[:200])
            slurm.cancel(job_id)
            return "stopped with a verdict"
        sleep(poll_s)
    return f"job still completing after {timeout_s:g} s; not stopped"
