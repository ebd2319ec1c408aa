"""Where a run is: its event log and state, summarised (``slurm-robust status``)."""

from __future__ import annotations

import pwd
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.launcher.control.external_requeue import read_previous_end
from slurm_robust.launcher.control.state import RunState, load_state
from slurm_robust.launcher.messages import Incident, IncidentState
from slurm_robust.launcher.paths import RunPaths, run_dir_from_comment
from slurm_robust.records import EVENT_SCHEMA, VERDICT_SCHEMA, read_records
from slurm_robust.run_dir_trust import check_run_dir, run_dir_owner
from slurm_robust.slurm import Slurm


@dataclass(frozen=True)
class RunTarget:
    """A run directory an admin tool may use, and the uid whose files it accepts there."""

    run_dir: str
    owner: int


def user_uid(user: str, job_id: str) -> int:
    """The uid of a job's user as Slurm names it (UsageError when this host lacks it)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        if user.isdigit():
            return int(user)
        raise UsageError(f"job {job_id}'s user {user!r} is unknown on this host; give "
                         "the run directory instead") from None


def job_run(job_id: str, run_dir: str | None = None, slurm: Slurm | None = None
            ) -> RunTarget:
    """Job ``job_id``'s run directory (``run_dir``, or the one its Slurm comment names),
    verified to be its user's: the comment is the job's own words, so a directory of
    anyone else (even root's) or one others can write is refused before anything is read
    or written there (run_dir_trust.py)."""
    job = (slurm or Slurm()).job(job_id)
    if job is None:
        raise UsageError(f"job {job_id} is not a running robust job known to Slurm; "
                         "give its run directory instead")
    run_dir = run_dir or run_dir_from_comment(job.comment)
    if not run_dir:
        raise UsageError(f"job {job_id} has no run directory in its comment (not a "
                         "robust job?); give its run directory instead")
    owner = user_uid(job.user, job_id)
    check_run_dir(run_dir, owner)
    return RunTarget(str(Path(run_dir).absolute()), owner)


def resolve_run(target: str, slurm: Slurm | None = None) -> RunTarget:
    """A run directory, or a job id whose comment names one (via the Slurm layer), with
    the owner its files must have: the job's user for a job id; for a directory, the
    caller (root: the directory's owner, run_dir_trust.run_dir_owner)."""
    if Path(target).is_dir():
        owner = run_dir_owner(target)
        check_run_dir(target, owner)
        return RunTarget(str(Path(target).absolute()), owner)
    if target.isdigit():
        return job_run(target, slurm=slurm)
    raise UsageError(f"{target!r} is neither a run directory nor a job id")


def resolve_run_dir(target: str) -> str:
    """:func:`resolve_run`'s directory (verified the same way)."""
    return resolve_run(target).run_dir


#: One incident as ``status`` shows it (functional form: ``class`` is a keyword).
IncidentSummary = TypedDict("IncidentSummary", {
    "incident": str, "class": str, "rung": str | None, "nodes": list[str],
    "ranks": list[int], "steps_lost": int | None, "restore_tier": str | None,
    "recovery_s": float | None, "detect_s": float | None})


class StatusReport(TypedDict, total=False):
    """``slurm-robust status --json``: a run as its event log and state.json show it
    (only ``run_dir``, ``status``, ``events`` and ``malformed_lines`` while pending)."""

    run_dir: str
    run_id: str | None
    job_id: str | None
    status: str
    verdict: str | None
    params_sha256: str | None
    attempt: int | None
    restarts: int
    requeues: int
    nodes: list[str] | None
    world_size: int | None
    step: int | None
    step_reports: bool
    loss: float | None
    last_step_time: float | None
    incidents: list[IncidentSummary]
    open_incident: IncidentState | None
    verdicts: list[dict[str, str]]
    events: int
    malformed_lines: int
    pending: str | None
    #: Hang limits per phase in seconds (launcher/control/phases.py), when the workers
    #: declared phases; empty: the single rule (max(hang floor, factor x median step)).
    hang_limits: dict[str, float]


def run_status(target: str) -> StatusReport:
    run = resolve_run(target)
    run_dir = run.run_dir
    paths = RunPaths.of(run_dir)
    read = read_records(paths.events, EVENT_SCHEMA)
    events = read.records
    if not events:
        return {"run_dir": run_dir, "status": "pending", "events": 0,
                "malformed_lines": read.malformed}
    state = load_state(paths.state, run.owner)
    start = next((e for e in events if e["event"] == "run_start"), {})
    steps = [e for e in events if e["event"] == "step"]
    ends = [e for e in events if e["event"] == "run_end"]
    incidents = [_incident_summary(e) for e in events if e["event"] == "incident"]
    last = steps[-1] if steps else {}
    verdicts = read_records(paths.verdicts, VERDICT_SCHEMA).records
    return {
        "run_dir": run_dir, "run_id": events[0].get("run_id"),
        "job_id": events[-1].get("job_id"),
        "status": ends[-1]["status"] if ends else "running",
        "verdict": ends[-1].get("verdict") if ends else None,
        "params_sha256": ends[-1].get("params_sha256") if ends else None,
        "attempt": events[-1].get("attempt"), "restarts": state.restarts,
        "requeues": state.requeues, "nodes": state.slots or start.get("nodes"),
        "world_size": start.get("world_size"), "step": last.get("step"),
        "step_reports": bool(steps),
        "loss": last.get("loss"), "last_step_time": last.get("time"),
        "incidents": incidents,
        "open_incident": state.open_incident.state() if state.open_incident else None,
        "verdicts": [{"node": v["node"], "class": v["class"], "reason": v["reason"]}
                     for v in verdicts],
        "events": len(events), "malformed_lines": read.malformed,
        "pending": None if ends else (_backing_off(state) or _pending(state.open_incident)
                                      or _requeued_by_slurm(events[-1].get("job_id"), state,
                                                            last.get("step"))),
        "hang_limits": dict(state.hang_limits) if state.declares_phases else {},
    }


def _backing_off(state: RunState) -> str | None:
    """A restart held back by an external service's outage at start-up
    (control/outage.py): the service, and when the next attempt starts."""
    if state.outage_not_before is None:
        return None
    incident = state.open_incident
    outage = incident.evidence.get("outage") if incident is not None else None
    service = outage.get("service") if isinstance(outage, dict) else None
    when = time.strftime("%H:%M:%S", time.localtime(state.outage_not_before))
    return (f"backing off: {service or 'an external service'} unreachable at start-up "
            f"({state.outage_failures} attempt(s)); the next attempt starts at {when}")


def _pending(incident: Incident | None) -> str | None:
    """Why a requeued run waits: the controller counted too few nodes for it
    (control/shortfall.py, policy ``wait``), or the time limit requeued it
    (control/time_limit.py) and the next allocation has not made its first step."""
    if incident is None:
        return None
    if incident.cls == "time_limit" and incident.rung == "requeue":
        when = time.strftime("%H:%M:%S", time.localtime(incident.fault_time or
                                                         incident.detected_at))
        return (f"requeued: the time limit was near ({when}); the next allocation goes "
                f"on from step {incident.last_step}")
    outside = incident.evidence.get("requeue")
    if incident.rung == "requeue" and isinstance(outside, dict) and outside.get("by") == "slurm":
        return (f"requeued by Slurm: {_cause(outside.get('slurm_state'), incident.cls)}; "
                f"the next allocation goes on from step {incident.last_step}")
    short = incident.evidence.get("shortfall")
    if not short or short.get("choice") != "requeue":
        return None
    return (f"pending: reserve shortfall (needs {short['needs']}, has {short['has']}) in "
            f"partition {short['partition']}")


def _cause(slurm_state: str | None, cls: str) -> str:
    """A requeue's cause as a user reads it."""
    if slurm_state == "PREEMPTED":
        return "preempted for higher-priority work"
    if slurm_state == "NODE_FAIL":
        return "a node failed"
    if slurm_state is None:
        return f"{cls} (accounting did not say why)"
    return f"requeued by an administrator or the job's owner (Slurm: {slurm_state})"


def _requeued_by_slurm(job_id: str | None, state: RunState, step: int | None) -> str | None:
    """Why a job that Slurm requeued without the launcher (an admin's requeue, a
    preemption) waits in the queue: its requeue count is above the one state.json was
    written under and no allocation has started since (control/external_requeue.py).
    None when it is not so, or Slurm cannot be asked (status also reads run directories
    where no Slurm is reachable)."""
    if not job_id or not str(job_id).isdigit() or state.restart_count is None or \
            state.open_incident is not None:
        return None
    try:
        job = Slurm().job(str(job_id))
        if job is None or job.state != "PENDING" or job.restart_count <= state.restart_count:
            return None
        end = read_previous_end(str(job_id))
    except (SlurmRobustError, OSError, ValueError):
        return None
    when = (time.strftime("%H:%M:%S", time.localtime(end.ended_at))
            if end is not None and end.ended_at is not None else "?")
    cause = _cause(end.state if end is not None else None, "requeued")
    return (f"requeued by Slurm at {when}: {cause}; waiting in the queue ({job.state_reason}); "
            f"the next allocation goes on from step {step}")


# open-ended: an events.jsonl record as read, not checked against its schema here
def _incident_summary(e: dict[str, Any]) -> IncidentSummary:
    start = e.get("fault_time") or e.get("detected_at")
    rec = e.get("recovered_at")
    return {"incident": e["incident"], "class": e["class"], "rung": e["rung"],
            "nodes": e["nodes"], "ranks": e["ranks"], "steps_lost": e["steps_lost"],
            "restore_tier": e["restore_tier"],
            "recovery_s": round(rec - start, 2) if rec and start else None,
            "detect_s": round(e["detected_at"] - start, 2) if start else None}


def format_status(s: StatusReport) -> str:
    if s.get("status") == "pending":
        return f"{s['run_dir']}: no events yet (job pending or starting)"
    # A script that reports no steps (no training API, no --auto-steps) has no step to
    # show: say so rather than print "step None".
    where = (f"step {s['step']}  loss {_num(s['loss'])}" if s.get("step_reports", True)
             else "no step reports")
    lines = [f"run {s['run_id']}  job {s['job_id']}  {s['status']}  {where}  "
             f"attempt {s['attempt']}  restarts {s['restarts']}",
             f"  nodes: {', '.join(s['nodes'] or [])}  run dir: {s['run_dir']}"]
    if s.get("pending"):
        lines.append(f"  {s['pending']}")
    if s.get("hang_limits"):
        limits = ", ".join(f"{k} {_num(float(v))} s" for k, v in s["hang_limits"].items())
        lines.append(f"  hang limits: {limits}")
    if s.get("verdict"):
        lines.append(f"  verdict: {s['verdict']}")
    if s.get("params_sha256"):
        lines.append(f"  params_sha256: {s['params_sha256']}")
    for i in s["incidents"]:
        lines.append(f"  incident {i['incident']}: {i['class']} -> {i['rung']} on "
                     f"{','.join(i['nodes']) or '-'} ranks {i['ranks']}; recovered in "
                     f"{_num(i['recovery_s'])} s, {_lost(i['steps_lost'])}, restored "
                     f"from {i['restore_tier'] or '-'}")
    if s.get("open_incident"):
        o = s["open_incident"]
        lines.append(f"  open incident {o['incident']}: {o['class']} -> {o['rung']} "
                     "(recovering)")
    for v in s["verdicts"]:
        lines.append(f"  verdict for node {v['node']}: {v['class']}: {v['reason']}")
    return "\n".join(lines)


def _lost(n: int | None) -> str:
    return "steps lost unknown (no step reports)" if n is None else f"{n} step(s) lost"


def _num(x: Any) -> str:
    return "-" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
