"""What the node Prolog and Epilog programs do (prolog/prolog.py, epilog/epilog.py).

It composes two features and so sits above both: the health suite decides, the reserve's
repeat-offender rule (its history and window) words the drain reason. Inside either
package it would make health and reserve import each other.

Run by slurmd as root: the node name and job come from slurmd's environment, are
validated, and never evaluated; job-controlled values (name, comment, the job's own
environment) are not read at all. On success no Slurm command runs; on failure the node
is drained with the failing check's reason (see drain.py) and the exit is non-zero, so
Slurm requeues the job (prolog) or keeps the node out (epilog).
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.breaker import BreakerUnavailable, Claim, DrainBreaker, breaker_config
from slurm_robust.health.checks.host import RESOURCE_CHECKS
from slurm_robust.health.drain import drain_for_failure
from slurm_robust.health.journal import read_journal
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.health.suite import job_identity, run_suite
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.history import (
    events_from_health,
    repeat_offender_reason,
    returns_from_health,
)
from slurm_robust.reserve.verdicts import ensure_user_spool
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import check_job_id, check_node_name

EXIT_OK = 0
EXIT_FAILED = 1


def node_and_job(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """$SLURMD_NODENAME (else the short host name) and $SLURM_JOB_ID (validated)."""
    node = check_node_name(environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])
    job_text = environ.get("SLURM_JOB_ID", "")
    return node, check_job_id(job_text) if job_text else None


def main(stage: str, environ: Mapping[str, str], out: TextIO = sys.stdout,
         err: TextIO = sys.stderr) -> int:
    """Run the stage's suite; drain and return EXIT_FAILED on a failure."""
    try:
        node, job = node_and_job(environ)
    except SlurmRobustError as exc:
        print(f"slurm_robust {stage}: {exc}", file=err)
        return EXIT_FAILED  # no node name we trust: nothing to drain, let Slurm do it
    uid, gpus = job_identity(environ)
    if stage == "prolog" and uid is not None and os.geteuid() == 0:
        _ensure_verdict_spool(uid, err)
    try:
        result = run_suite(stage, node, job, job_uid=uid, job_gpus=gpus)
    except SlurmRobustError as exc:
        # A broken site config fails closed: the node must not take jobs unchecked.
        return _drain_and_fail(stage, node, f"slurm_robust: {stage} error: {exc}", err,
                               job=job)
    print(json.dumps({"stage": stage, "node": node, "job": job, "passed": result.passed,
                      "run_id": result.run_id, "reason": result.reason,
                      "check_errors": [r.reason for r in result.errors]}), file=out)
    if result.passed:
        return EXIT_OK
    # A shortfall of disk, memory or /dev/shm alone is drained, but never as a repeat
    # offender: other users can cause one (the checks warn when they can tell).
    resource_only = all(f.check in RESOURCE_CHECKS for f in result.failures)
    failed = [NodeEvent(node, EventKind.CHECK_FAILED, stage, job_id=job, check=f.check,
                        evidence={"reason": f.reason, "run_id": result.run_id})
              for f in result.failures]
    return _drain_and_fail(stage, node, result.reason, err, repeatable=not resource_only,
                           job=job, events=failed)


def _ensure_verdict_spool(uid: int, err: TextIO) -> None:
    """The job's user gets its verdict spool directory (root makes it: no user can create
    another's first). One stat when it exists; never fails the job."""
    try:
        user = pwd.getpwuid(uid).pw_name  # from the system, not from the job's environment
        root = reserve_config(load_site_config()).verdict_root
        if root.is_dir():
            done = ensure_user_spool(root, user, uid)
            if done != "ok":
                print(f"slurm_robust prolog: verdict spool for {user}: {done}", file=err)
    except (KeyError, OSError, SlurmRobustError) as exc:
        print(f"slurm_robust prolog: verdict spool not prepared: {exc}", file=err)


def repeat_offender(node: str, reason: str, now: float | None = None) -> str | None:
    """The repeat-offender drain reason when ``node`` fails again soon after a resume.

    Read from the node's own journal (a ``resume`` pass is a return to service), so the
    failure path needs no extra Slurm call. The window is the reserve's ``repeat_window_h``.
    """
    site = load_site_config()
    records = read_journal(node, site)
    events = events_from_health(records) + returns_from_health(records)
    window_s = reserve_config(site).repeat_window_h * 3600.0
    return repeat_offender_reason(node, events, time.time() if now is None else now,
                                  window_s, reason)


def _drain_and_fail(stage: str, node: str, reason: str, err: TextIO,
                    repeatable: bool = True, job: str | None = None,
                    events: list[NodeEvent] | None = None) -> int:
    """Drain (the breaker permitting) and fail; then record what was done in the node
    ledger, which never changes the outcome (health/ledger_writer.py)."""
    events = list(events or [])
    code = _drain_decision(stage, node, reason, err, repeatable, job, events)
    record_safely(events, warn=lambda text: print(f"slurm_robust {stage}: {text}", file=err))
    return code


def _drain_decision(stage: str, node: str, reason: str, err: TextIO, repeatable: bool,
                    job: str | None, events: list[NodeEvent]) -> int:
    try:
        if repeatable:
            reason = repeat_offender(node, reason) or reason
    except SlurmRobustError as exc:
        print(f"slurm_robust {stage}: repeat-offender check skipped: {exc}", file=err)
    print(f"slurm_robust {stage}: {reason}", file=err)
    claim = ask_breaker(node, reason, stage, err)
    if claim is not None and not claim.granted:
        # Tripped: the failure is recorded as "would drain" and the node keeps running
        # (a prolog that failed here would make Slurm drain it with "Prolog error").
        print(f"slurm_robust {stage}: not drained: {claim.why}", file=err)
        events.append(NodeEvent(node, EventKind.WOULD_DRAIN, stage, job_id=job,
                                evidence={"reason": reason, "why": claim.why}))
        return EXIT_OK
    try:
        decision = drain_for_failure(node, reason)
        print(f"slurm_robust {stage}: {decision.action}: {decision.why}", file=err)
        if decision.action == "drain":
            events.append(NodeEvent(node, EventKind.DRAIN, stage, job_id=job,
                                    evidence={"reason": decision.reason}))
    except SlurmRobustError as exc:
        # Still fail: Slurm drains the node itself ("Prolog error"), just without our reason.
        print(f"slurm_robust {stage}: could not set the drain reason: {exc}", file=err)
    return EXIT_FAILED


def ask_breaker(node: str, reason: str, source: str, err: TextIO) -> Claim | None:
    """The drain circuit breaker's answer (health/breaker.py); None when it cannot be
    asked (no readable site config, the breaker unusable here): the drain goes ahead."""
    try:
        breaker = DrainBreaker(breaker_config(load_site_config().breaker))
        return breaker.claim(node, reason, source)
    except (BreakerUnavailable, SlurmRobustError) as exc:
        print(f"slurm_robust {source}: drain circuit breaker not asked: {exc}", file=err)
        return None
