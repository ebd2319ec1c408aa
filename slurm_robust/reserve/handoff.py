"""EpilogSlurmctld's work: apply a job's verdicts and hand it spares from the reserve.

Runs as SlurmUser at every job end. A job without a verdict file costs one failed
``open`` and no Slurm call. Otherwise: every verdict is validated (only nodes of the job's
allocation: ``SLURM_JOB_NODELIST``, else any node sacct says the job was given, since
Slurm takes a DOWN node out of a ``--no-kill`` job), refusals are logged, and under the
reserve lock the blamed nodes, and nodes Slurm marked DOWN under the job, are drained
pending a deep check (an admin's reason is never replaced; a repeat offender's reason says
so; at most ``job_blame_cap`` over the job's life) and, if the job was requeued, as many
spares as it lost (within the same cap) are
moved from the reserve into its partition; :func:`start_when_requeued` then resets its
StartTime (detached, once Slurm has finished requeueing it) so it starts at once. A job
that requeued itself without blaming a node leaves only a restart request in the file,
and gets the same reset.
``reserve reconcile`` refills the reserve afterwards.

Every applied or refused verdict is logged to ``SiteConfig.verdict_log`` as a
``slurm_robust.verdict_action`` record (docs/SCHEMAS.md), and every validated verdict is
a ``blame`` in the node ledger (health/node_ledger.py), whose lemons are never handed
over as spares.
"""

from __future__ import annotations

import logging
import pwd
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.health.breaker import DrainBreaker, site_breaker
from slurm_robust.health.ledger_writer import SiteLedger
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.records import append_records, make_record
from slurm_robust.reserve.allocation import GivenNodes, sacct_nodes
from slurm_robust.reserve.config import (
    HOUR_S,
    SHARED_FILE_MODE,
    ReserveConfig,
    reserve_config,
)
from slurm_robust.reserve.executor import Executor
from slurm_robust.reserve.gate import HealthGate
from slurm_robust.reserve.history import events_from_sacctmgr, repeat_offender_reason
from slurm_robust.reserve.ledger import ledger_path, load_ledger, save_ledger
from slurm_robust.reserve.lock import reserve_lock
from slurm_robust.reserve.plan import NodeView, Snapshot, plan_handoff
from slurm_robust.reserve.reconcile import take_snapshot
from slurm_robust.reserve.respare import replace_failed_spares
from slurm_robust.reserve.unreachable import DownOutcome, Probe, down_unreachable, slurmd_answers
from slurm_robust.reserve.verdicts import (
    Refusal,
    Verdict,
    VerdictBatch,
    check_user_name,
    read_job_verdicts,
    restore_verdicts,
)
from slurm_robust.site_config import SiteConfig
from slurm_robust.slurm import Job, Slurm, check_job_id, expand_hostlist
from slurm_robust.slurm.restart import start_requeued

VERDICT_ACTION_SCHEMA = "slurm_robust.verdict_action"
VERDICT_ACTION_VERSION = 1
# Job states in which a job ended by requeue is waiting to run again.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})


def is_requeued(job: Job | None, now: float) -> bool:
    """Whether the job that just ended will run again (pure).

    Seen on 22.05: while EpilogSlurmctld runs, squeue reports a requeued job and a job
    that ended for good both as COMPLETING; the requeued one has no end time yet
    (EndTime=Unknown, a far-future number in JSON), the ended one ends in the past.
    """
    if job is None:
        return False
    if job.state in REQUEUED_STATES:
        return True
    return job.state == "COMPLETING" and (job.end_time == 0 or job.end_time > now)
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"


@dataclass(frozen=True)
class JobEnd:
    """What EpilogSlurmctld's environment says about the job that ended."""

    job_id: str
    user: str
    uid: int
    nodes: tuple[str, ...]
    partition: str
    restart_count: int


def job_end_from_env(env: Mapping[str, str]) -> JobEnd:
    """Parse and validate the EpilogSlurmctld environment (no Slurm call).

    Raises:
        UsageError: a variable is missing or malformed.
    """
    job_id = check_job_id(env.get("SLURM_JOB_ID", ""))
    user = check_user_name(env.get("SLURM_JOB_USER", ""))
    uid_text = env.get("SLURM_JOB_UID", "")
    try:
        uid = int(uid_text) if uid_text else pwd.getpwnam(user).pw_uid
    except (ValueError, KeyError) as exc:
        raise UsageError(f"cannot resolve the uid of job {job_id}'s user {user!r}") from exc
    nodes = tuple(expand_hostlist(env.get("SLURM_JOB_NODELIST", "")))
    try:
        restarts = int(env.get("SLURM_JOB_RESTART_COUNT", "0") or 0)
    except ValueError:
        restarts = 0
    partition = env.get("SLURM_JOB_PARTITION", "").split(",")[0]
    return JobEnd(job_id, user, uid, nodes, partition, restarts)


@dataclass
class HandoffReport:
    job_id: str
    verdicts: int
    refused: int
    drained: list[str] = field(default_factory=list)
    handed_over: list[str] = field(default_factory=list)
    shortfall: int = 0
    requeued: bool = False
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    #: Handed-over spares that failed a check at this job end (see respare.py).
    spare_failed: list[str] = field(default_factory=list)
    #: Set when the job cannot be placed any more: stop it with this verdict.
    stop_reason: str | None = None


def _respare(end: JobEnd, site: SiteConfig, cfg: ReserveConfig,
             slurm_factory: Callable[[], Slurm], gate_factory: Callable[[Slurm], HealthGate],
             clock: Callable[[], float]) -> HandoffReport | None:
    """A job end without verdicts, of a job that was handed spares: replace those that
    failed a check (their prolog), bounded; record each step in the verdict log."""
    slurm = slurm_factory()
    lemons = SiteLedger(site).lemons()
    with reserve_lock(cfg.lock_file, cfg.lock_timeout_s):
        ledger = load_ledger(cfg.ledger_dir, end.job_id)
        job = slurm.job(end.job_id)
        now = clock()
        partition = end.partition or (job.partition.split(",")[0] if job else "")
        requeued = is_requeued(job, now)
        done = replace_failed_spares(end.job_id, partition, job, requeued, ledger, cfg,
                                     slurm, gate_factory(slurm), now, clock, lemons)
        if done is None:
            return None
        save_ledger(cfg.ledger_dir, ledger)
    report = HandoffReport(end.job_id, 0, 0, requeued=requeued, outcomes=done.outcomes,
                           handed_over=done.replaced_by, shortfall=done.shortfall,
                           spare_failed=done.failed, stop_reason=done.stop_reason)
    append_records(site.verdict_log, [make_record(
        VERDICT_ACTION_SCHEMA, VERDICT_ACTION_VERSION,
        {"job_id": end.job_id, "user": end.user, "node": node, "action": "spare_failed",
         "why": "a spare handed to the job failed a check (its prolog)",
         "requeued": requeued, "handed_over": done.replaced_by, "shortfall": done.shortfall,
         "stop_reason": done.stop_reason, "ok": True}, now=clock()) for node in done.failed])
    return report


def handle_job_end(end: JobEnd, site: SiteConfig, slurm_factory: Callable[[], Slurm],
                   gate_factory: Callable[[Slurm], HealthGate],
                   clock: Callable[[], float] = time.time,
                   probe: Probe = slurmd_answers) -> HandoffReport | None:
    """Apply job ``end``'s verdicts; None (and no Slurm call) when it left none. A
    restart request alone (verdicts.write_restart_request) costs one Slurm call: whether
    the job was requeued (``report.requeued``, on which the caller starts it).

    For a requeued job, the drained nodes among them whose slurmd is gone are then set
    DOWN (``probe`` asks; see unreachable.py), outside the reserve lock."""
    cfg = reserve_config(site)
    # Judged against every node the job was given, not the shrunken list.
    given = GivenNodes(end.nodes, lambda: sacct_nodes(slurm_factory(), end.job_id))
    batch = read_job_verdicts(cfg.verdict_root, end.user, end.uid, end.job_id, given,
                              cfg.verdict_max_bytes, cfg.verdict_max_records, end.restart_count)
    if batch is None:
        if not ledger_path(cfg.ledger_dir, end.job_id).exists():
            return None  # never handed a spare: nothing of ours can have failed
        return _respare(end, site, cfg, slurm_factory, gate_factory, clock)
    report = HandoffReport(end.job_id, len(batch.verdicts), len(batch.refusals))
    _log_refusals(site, end, batch, clock())
    if not batch.verdicts:
        if batch.restart_requested:
            # A requeue that blamed no node: only the start (the caller's) is wanted.
            report.requeued = is_requeued(slurm_factory().job(end.job_id), clock())
        return report
    nodes = SiteLedger(site)
    # Read before the lock: the reserve lock is never held waiting on the ledger's.
    lemons = nodes.lemons()
    try:
        slurm = slurm_factory()
        with reserve_lock(cfg.lock_file, cfg.lock_timeout_s):
            applied = _apply(end, batch.verdicts, given, cfg, slurm, gate_factory(slurm),
                             report, clock, _breaker(site), lemons, nodes)
    except SlurmRobustError:
        # Nothing applied for sure: put the file back so the next end of the job retries.
        restore_verdicts(batch)
        raise
    _log_applied(site, end, applied, report, clock())
    if report.requeued:
        _log_downs(site, end, down_unreachable(slurm, [v.node for v in applied], probe),
                   clock())
    # Last: bookkeeping never delays what the requeued job waits for.
    nodes.record(blame_events(end, applied, clock()))
    return report


def blame_events(end: JobEnd, verdicts: list[Verdict], now: float) -> list[NodeEvent]:
    """The node-ledger ``blame`` of each verdict acted on (validated: a node the job was
    given; a node Slurm marked DOWN under it counts too). The job-written text is bounded
    again by the ledger."""
    return [NodeEvent(v.node, EventKind.BLAME, "epilog_slurmctld", now, end.job_id, v.cls,
                      {"reason": v.reason, "incident": v.incident, "user": end.user,
                       "evidence": v.evidence}) for v in verdicts]


def _apply(end: JobEnd, verdicts: list[Verdict], given: GivenNodes, cfg: ReserveConfig,
           slurm: Slurm, gate: HealthGate, report: HandoffReport,
           clock: Callable[[], float], breaker: DrainBreaker | None = None,
           lemons: frozenset[str] = frozenset(),
           nodes: SiteLedger | None = None) -> list[Verdict]:
    """Apply the verdicts (plus nodes Slurm marked DOWN under the job); returns all the
    verdicts acted on, for the log. ``lemons`` are never handed over as spares."""
    job = slurm.job(end.job_id)
    now = clock()
    report.requeued = is_requeued(job, now)
    partition = end.partition or (job.partition.split(",")[0] if job else "")
    verdicts = verdicts + down_under_job(slurm, end.job_id, given, verdicts)
    snap = take_snapshot(slurm, gate, cfg, now, [partition] if partition else [], lemons)
    snap = _with_nodes(snap, slurm, [v.node for v in verdicts])
    repeats = _repeat_reasons(slurm, cfg, verdicts, now)
    ledger = load_ledger(cfg.ledger_dir, end.job_id)
    # Default cap: the nodes the job holds (never drains more than it holds).
    cap = cfg.job_blame_cap or max(job.node_count if job else 0, len(end.nodes), 1)
    plan = plan_handoff(end.job_id, partition, report.requeued, verdicts, snap, cfg, repeats,
                        ledger, cap)
    report.outcomes = Executor(slurm, gate, cfg.log_file, "handoff", clock=clock,
                               breaker=breaker,
                               record=nodes.record if nodes is not None else None
                               ).apply(plan.actions)
    report.drained = [o["node"] for o in report.outcomes
                      if o["action"] == "drain" and o["ok"] and "skipped" not in o]
    report.handed_over = [o["node"] for o in report.outcomes
                          if o["action"] == "move" and o["ok"]]
    report.shortfall = plan.shortfall
    ledger.drained = sorted(set(ledger.drained) | set(plan.lost))
    ledger.handed_over += report.handed_over
    save_ledger(cfg.ledger_dir, ledger)
    return verdicts


def down_under_job(slurm: Slurm, job_id: str, given: GivenNodes,
                   verdicts: list[Verdict]) -> list[Verdict]:
    """Nodes the job was given (sacct) that Slurm marked DOWN and took out of it, and that
    no verdict names: they get the same treatment as blamed nodes (drained pending a deep
    check, never back to service unchecked by ReturnToService)."""
    named = {v.node for v in verdicts}
    lost = sorted(given.lost() - named)
    if not lost:
        return []
    out = []
    for node in slurm.nodes(lost):
        if node.state == "down" or not node.responding:
            out.append(Verdict(job_id, node.name, f"Slurm marked it {node.state.upper()} "
                                                  "under the job", "node_down", "",
                               {"slurm_state": node.state, "slurm_reason": node.reason}))
    return out


def start_when_requeued(slurm: Slurm, job_id: str, timeout_s: float,
                        requeued_at: float | None = None) -> str:
    """Reset a requeued job's StartTime once that is safe (slurm/restart.py: pending
    again, and past the credential margin counted from ``requeued_at``, a wall-clock time
    no earlier than the requeue, by default now); returns what happened. Run it detached
    from EpilogSlurmctld (see epilog/epilog_slurmctld.py) so slurmctld is never held up.
    """
    return start_requeued(slurm, job_id, time.time() if requeued_at is None else requeued_at,
                          timeout_s, poll_s=0.5)


def _with_nodes(snap: Snapshot, slurm: Slurm, names: list[str]) -> Snapshot:
    """Add the blamed nodes' views (they may be in a partition the snapshot lacks)."""
    missing = [n for n in names if n not in snap.nodes]
    if not missing:
        return snap
    views = dict(snap.nodes)
    for n in slurm.nodes(missing):
        views[n.name] = NodeView(n.name, n.idle, n.drained, n.usable, n.reason, None)
    return Snapshot(snap.now, views, snap.partitions, snap.lemons)


def _repeat_reasons(slurm: Slurm, cfg: ReserveConfig, verdicts: list[Verdict],
                    now: float) -> dict[str, str]:
    window = cfg.repeat_window_h * HOUR_S
    since = time.strftime(_SACCT_TIME, time.localtime(now - 2 * window))
    try:
        raw = slurm.node_events_raw(args=[f"start={since}",
                                          f"nodes={','.join(v.node for v in verdicts)}"])
    except SlurmRobustError:
        return {}  # no accounting: no history, so nobody is a known repeat offender
    history = events_from_sacctmgr(raw)
    out = {}
    for v in verdicts:
        reason = repeat_offender_reason(v.node, history, now, window, v.reason)
        if reason:
            out[v.node] = reason
    return out


def _log_refusals(site: SiteConfig, end: JobEnd, batch: VerdictBatch, now: float) -> None:
    records = [make_record(VERDICT_ACTION_SCHEMA, VERDICT_ACTION_VERSION,
                           _refusal_fields(end, batch, r), now=now) for r in batch.refusals]
    if records:
        append_records(site.verdict_log, records, mode=SHARED_FILE_MODE)


def _refusal_fields(end: JobEnd, batch: VerdictBatch, r: Refusal) -> dict[str, Any]:
    return {"job_id": end.job_id, "user": end.user, "node": r.node, "action": "refused",
            "why": r.why, "excerpt": r.excerpt, "file": str(batch.path)}


def _log_applied(site: SiteConfig, end: JobEnd, verdicts: list[Verdict],
                 report: HandoffReport, now: float) -> None:
    by_node = {o["node"]: o for o in report.outcomes if o.get("action") in ("drain", "note")}
    records = []
    for v in verdicts:
        o = by_node.get(v.node, {})
        records.append(make_record(VERDICT_ACTION_SCHEMA, VERDICT_ACTION_VERSION, {
            "job_id": end.job_id, "user": end.user, "node": v.node,
            "action": "drained" if v.node in report.drained else "kept",
            "why": o.get("skipped") or o.get("why") or o.get("error", ""),
            "reason": o.get("reason", ""), "class": v.cls, "incident": v.incident,
            "ok": bool(o.get("ok", False)), "requeued": report.requeued,
            "handed_over": report.handed_over, "shortfall": report.shortfall}, now=now))
    append_records(site.verdict_log, records, mode=SHARED_FILE_MODE)


def _log_downs(site: SiteConfig, end: JobEnd, downs: list[DownOutcome], now: float) -> None:
    if downs:
        append_records(site.verdict_log, [make_record(VERDICT_ACTION_SCHEMA,
                                                      VERDICT_ACTION_VERSION, {
            "job_id": end.job_id, "user": end.user, "node": d.node, "action": "down",
            "why": d.why, "error": d.error, "ok": d.ok, "requeued": True}, now=now)
            for d in downs], mode=SHARED_FILE_MODE)


log = logging.getLogger("slurm_robust.reserve")


def _breaker(site: SiteConfig) -> DrainBreaker | None:
    """The site's drain circuit breaker; a section that does not fit is logged and the
    verdicts are applied without it (``slurm-robust check`` reports the section)."""
    try:
        return site_breaker(site.breaker)
    except UsageError as exc:
        log.warning("drain circuit breaker off: %s", exc)
        return None
