"""The Slurm side of recovery: verdicts, requeue with an immediate start, direct drains.

Every Slurm call goes through :class:`slurm_robust.slurm.Slurm`. An unprivileged user may
requeue their own job and reset its StartTime (running again within seconds instead of
Slurm's ~120 s hold), and may set ExcNodeList on it while it is pending, so the job does
not land again on the node it blamed before the privileged epilog drains that node.
Draining directly needs a Slurm operator; it is attempted only when ``RunConfig.drain`` is
set, and a refusal is logged, not fatal (the verdict file is the channel that always works).
"""

from __future__ import annotations

import logging
import os
import pwd
import time
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.drain import ReasonKind, drain_reason
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.blame import verdict_reason
from slurm_robust.launcher.control.events import EventLog, last_logged_step, new_incident
from slurm_robust.launcher.control.shortfall import (
    Choice,
    ShortfallPolicy,
    job_capacity,
    plan_requeue,
    reserve_partition,
)
from slurm_robust.launcher.control.shortfall import evidence as shortfall_evidence
from slurm_robust.launcher.control.slurm_actions import retry_transient
from slurm_robust.launcher.control.state import RunState, load_state, save_state
from slurm_robust.launcher.enums import Category, IncidentClass, Rung
from slurm_robust.launcher.paths import RunPaths, load_site
from slurm_robust.records import VERDICT_SCHEMA, VERDICT_VERSION, append_record, make_record
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.verdicts import VerdictError, write_restart_request
from slurm_robust.reserve.verdicts import write_verdict as spool_verdict
from slurm_robust.slurm import Slurm, SlurmCommandError

log = logging.getLogger("slurm_robust.launcher.control.requeue")


def write_verdict(paths: RunPaths, job_id: str, node: str, reason: str, cls: str,
                  evidence: Mapping[str, Any], incident: str,
                  site_config: str | None = None) -> None:
    """Record a ``slurm_robust.verdict`` (docs/SCHEMAS.md) where EpilogSlurmctld reads it
    (``<verdict_dir>/<user>/<job>.jsonl``, via slurm_robust.reserve) and in the run's own
    copy. Without the spool directory (no reserve set up on this cluster) only the run's
    copy is written, and that is logged: the node is then not drained by the epilog."""

    user = _job_user()
    try:
        root = reserve_config(load_site(site_config)).verdict_root
        spool_verdict(root, user, job_id, node, reason, cls, dict(evidence), incident,
                      run_dir=paths.root)
        return
    except (VerdictError, UsageError) as exc:
        log.warning("verdict for %s kept in the run directory only: %s", node, exc)
    append_record(paths.verdicts, make_record(VERDICT_SCHEMA, VERDICT_VERSION, {
        "job_id": job_id, "node": node, "reason": reason, "class": cls,
        "evidence": dict(evidence), "incident": incident}))


def _job_user() -> str:
    return os.environ.get("SLURM_JOB_USER") or pwd.getpwuid(os.geteuid()).pw_name


def request_restart(job_id: str, why: str, site_config: str | None = None) -> bool:
    """Leave a restart request where EpilogSlurmctld reads verdicts, so the requeue about
    to be made starts again at once instead of after Slurm's hold (reserve/verdicts.py).
    Best effort: without the spool (no reserve set up here) the job waits out the hold,
    and that is logged. Returns whether the request was written."""
    try:
        root = reserve_config(load_site(site_config)).verdict_root
        write_restart_request(root, _job_user(), job_id, why)
        return True
    except (VerdictError, UsageError, OSError) as exc:
        log.warning("no restart request for job %s (it waits out Slurm's requeue hold): %s",
                    job_id, exc)
        return False


def drain_directly(nodes: Sequence[str], reason: str) -> list[str]:
    """Drain as a Slurm operator; returns the nodes drained (refusals are logged).

    A slurmctld that is away is waited for (slurm_actions' budget); run it off the
    control loop (recovery starts it as a SlurmAction)."""
    slurm, done = Slurm(), []
    for node in nodes:
        try:
            retry_transient(lambda n=node: slurm.drain(n, drain_reason(reason, "",
                                                                        ReasonKind.PENDING)),
                            f"drain {node}")
            done.append(node)
        except SlurmCommandError as exc:
            log.warning("could not drain %s directly (not a Slurm operator?): %s", node, exc)
    return done


def requeued_since(slurm: Slurm, job_id: str, restart_count: int) -> bool:
    """Whether Slurm has requeued the job since this allocation started: its restart
    count went up, or it is pending again. Raises SlurmCommandError when Slurm cannot
    tell (slurmctld away)."""
    job = slurm.job(job_id)
    if job is None:
        return False
    return job.restart_count > restart_count or job.state in REQUEUED_STATES


#: squeue states of a job that went back to the queue.
REQUEUED_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


def requeue_job(job_id: str, exclude: Sequence[str], restart_count: int | None = None,
                slurm: Slurm | None = None, num_nodes: int | None = None,
                site_config: str | None = None) -> None:
    """Requeue, keep the job off ``exclude``, and start it again as soon as possible.

    A slurmctld that is away, busy or answers "Unexpected message received" is retried
    within slurm_actions' budget; before each repeat Slurm is asked whether the requeue
    already went through (the job's restart count above ``restart_count``, by default
    this allocation's ``SLURM_RESTART_COUNT``, or the job pending again), so a lost
    answer never becomes a failed run behind a queued job. Raises SlurmCommandError when
    the requeue is refused for good; the follow-up updates are best effort (a job
    already running again cannot take ExcNodeList). ``num_nodes`` shrinks the pending
    job (fewer spares, see shortfall.py). Blocks: run it as a SlurmAction.

    The StartTime reset made here is undone by Slurm when the job finishes completing
    (slurm/restart.py); what starts the job at once is EpilogSlurmctld, on the restart
    request written first (``site_config``'s spool).
    """
    slurm = slurm or Slurm()
    if restart_count is None:
        restart_count = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    request_restart(job_id, "requeued by slurm_robust", site_config)

    def settled() -> bool:
        return requeued_since(slurm, job_id, restart_count)

    retry_transient(lambda: slurm.requeue(job_id, start_now=False), f"requeue {job_id}",
                    settled=settled)
    fields: dict[str, str] = {"StartTime": "now"}
    if exclude:
        fields["ExcNodeList"] = ",".join(sorted(set(exclude)))
    if num_nodes is not None:
        # One task (agent) per node: the task count shrinks with the nodes, or Slurm
        # would keep asking for a task per lost node.
        fields.update(NumNodes=str(num_nodes), NumTasks=str(num_nodes))
    for attempt in range(5):
        try:
            retry_transient(lambda: slurm.update_job(job_id, **fields),
                            f"update {job_id} after requeue")
            return
        except SlurmCommandError as exc:
            log.warning("update after requeue of %s failed (try %d): %s", job_id, attempt, exc)
            time.sleep(0.5)


def cancel_job(job_id: str, slurm: Slurm | None = None) -> None:
    """``scancel`` the job, waiting out a slurmctld outage (slurm_actions' budget).

    For a run that ended after losing its batch node: Slurm 22.05 keeps such a job
    RUNNING under ``--no-kill`` (the batch step cannot report from a dead node), holding
    the nodes left until the time limit. Blocks."""
    slurm = slurm or Slurm()
    retry_transient(lambda: slurm.cancel(job_id), f"cancel {job_id}")


def requeue_after_controller_loss(cfg: RunConfig, ident: Any, controller_node: str | None,
                                  why: str, last_heard: float | None = None) -> bool:
    """Called by an agent that lost the controller: exactly one agent (an O_EXCL lock
    file per job step) records the incident in the run state, writes the verdict for
    the controller's node and requeues the job. Returns whether this agent did it."""
    if controller_node is not None and controller_node == ident.node:
        # Losing contact with a controller on this very node says nothing against the
        # node (a busy controller made agent 0 blame its own healthy node).
        log.warning("controller on this node (%s) not answering: %s; nothing blamed",
                    ident.node, why)
        return False
    paths = RunPaths.of(cfg.run_dir)
    lock = paths.root / f"requeue-{ident.step_key}.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    now = time.time()
    state = load_state(paths.state)
    if state.finished:
        return False
    node = controller_node or "unknown"
    state.incidents += 1
    ranks = [slot * cfg.workers_per_node + i for slot, n in enumerate(state.slots)
             if n == node for i in range(cfg.workers_per_node)]
    logged = last_logged_step(paths.events)
    last_step = max((s for s in (state.last_step, logged) if s is not None), default=None)
    incident = new_incident(f"i{state.incidents}", IncidentClass.NODE_LOST,
                            Category.EXPLICIT, now, fault_time=last_heard, nodes=[node],
                            ranks=ranks, last_step=last_step,
                            evidence={"detected_by": ident.node, "why": why[:300],
                                      "controller_lost": True})
    incident.localized_at, incident.rung = now, Rung.REQUEUE
    state.open_incident = incident
    state.restarts += 1
    state.requeues += 1
    state.blamed = sorted(set(state.blamed) | {node})
    # The same count and policy as the controller's requeue (shortfall.py).
    cap = job_capacity(ident.job_id, state.blamed, reserve_partition(cfg.site_config))
    plan = plan_requeue(cap, ShortfallPolicy(cfg.on_shortfall), cfg.nodes)
    if cap is not None and cap.short:
        log.warning("job %s: %s", ident.job_id, plan.reason)
        incident.evidence["shortfall"] = shortfall_evidence(cap, plan)
    save_state(paths.state, state)
    reason = verdict_reason(incident.cls, incident.evidence)
    write_verdict(paths, ident.job_id, node, reason, incident.cls, incident.evidence,
                  incident.incident, cfg.site_config)
    if cfg.drain:
        drain_directly([node], reason)
    if plan.choice is Choice.STOP:
        _stop_for_shortfall(paths, cfg, ident.job_id, state, plan.reason)
        return True
    requeue_job(ident.job_id, state.blamed, ident.restart_count,
                num_nodes=plan.nodes if plan.choice is Choice.SHRINK else None,
                site_config=cfg.site_config)
    return True


def _stop_for_shortfall(paths: RunPaths, cfg: RunConfig, job_id: str, state: RunState,
                        verdict: str) -> None:
    """No requeue: the incident (rung stop) and ``run_end`` go to the event log as the
    controller would have written them, and the state says the run is over."""
    incident = state.open_incident
    assert incident is not None  # set by the caller
    incident.rung = Rung.STOP
    state.requeues -= 1
    state.open_incident = None
    state.finished, state.verdict = "stopped", verdict
    save_state(paths.state, state)
    events = EventLog(paths.events, state.run_id, job_id, max(state.attempt, 0),
                      cfg.step_events_per_s)
    events.incident(incident)
    events.run_end("stopped", incident.last_step, None, verdict)
