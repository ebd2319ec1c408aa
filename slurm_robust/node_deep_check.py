"""Deep-check a node ON the node and return it to service (slurmd's HealthCheckProgram).

A node that a job blamed, that was found down under a job, or that an admin asked to
resume waits drained with the reason ``slurm_robust: pending deep check: ...``. slurmd
runs its HealthCheckProgram (``epilog/health_check.py``) as root on every node every
``HealthCheckInterval``, drained or not. That program asks Slurm for its own node's state
(one ``sinfo`` call); only when the node carries the pending reason does it run the deep
suite here, on the node it judges, and then:

- passed: the node is resumed (its journal's ``resume`` pass is the return to service
  that the repeat-offender rule counts);
- failed: the node stays drained with ``slurm_robust: deep check failed: <check>:
  <evidence>``, which nothing resumes automatically.

If the reason changed while the suite ran (an admin's drain, another program), the node
is left as it is. Each outcome is one ``slurm_robust.deep_check`` record in
``<state_dir>/deep_check.jsonl`` naming the slurmd node that ran it (docs/SCHEMAS.md).

The suite runs in a detached child so that slurmd's 60 s limit on the HealthCheckProgram
never cuts a deep suite short; a per-node lock keeps two runs from overlapping. Like the
prolog, it runs as root and reads nothing a job controls.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.drain import (
    DEEP_FAILED_PREFIX,
    PENDING_PREFIX,
    PREFIX,
    REASON_LIMIT,
    ReasonKind,
    drain_reason,
    flat_reason,
)
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.health.repair import (
    RepairConfig,
    RepairPhase,
    RepairRecord,
    RepairStep,
    after_suite,
    before_suite,
    boot_identity,
    clear_record,
    is_request,
    load_record,
    reboot_argv,
    repair_config,
    round_over,
    save_record,
)
from slurm_robust.health.suite import run_suite
from slurm_robust.pending_reason import is_pending
from slurm_robust.records import append_records, make_record
from slurm_robust.site_config import SiteConfig
from slurm_robust.slurm import Slurm
from slurm_robust.slurm.client import clean_reason

DEEP_CHECK_SCHEMA = "slurm_robust.deep_check"
DEEP_CHECK_VERSION = 1
OUTCOME_FILE = "deep_check.jsonl"
LOCK_FILE = ".deep_check.lock"
DRAINED_STATES = ("drained", "draining", "drain")
#: How long the reboot command may take to be accepted (scontrol asks slurmctld).
REBOOT_CALL_S = 60.0


@dataclass(frozen=True)
class DeepCheckOutcome:
    """What one deep check on a pending node did (``action``: resumed, drained, left)."""

    node: str
    slurmd_node: str
    host: str
    passed: bool
    action: str
    reason: str
    run_id: str
    previous_reason: str


def failed_reason(suite_reason: str) -> str:
    """``slurm_robust: deep check failed: <check>: <evidence>`` from a suite's reason."""
    detail = suite_reason[len(PREFIX):].strip() if suite_reason.startswith(PREFIX) \
        else suite_reason
    return f"{DEEP_FAILED_PREFIX} {detail or 'unspecified'}"


def outcome_path(node: str, site: SiteConfig) -> Path:
    return site.state_path(node) / OUTCOME_FILE


def deep_check_and_return(node: str, slurmd_node: str, slurm: Slurm, site: SiteConfig,
                          boot: str = "", run: Callable[[list[str]], str] | None = None,
                          now: Callable[[], float] = time.time) -> DeepCheckOutcome:
    """Run the deep suite here for ``node`` and resume or re-drain it (see module doc),
    as one step of the site's break-fix loop (health/repair.py). ``boot``: this node's
    boot identity (repair.boot_identity, read before detaching); ``run``: runs the
    reboot command, returns "" or why it failed (tests inject one)."""
    state, reason = slurm.node_state_reason(node)
    cfg = repair_config(site.repair)
    state_dir = site.state_path(node)
    record = load_record(state_dir, node)
    if record is not None and clean_reason(record.reason) != reason:
        record = None  # the loop set another reason: someone put the node back in it
    rebooted = record is not None and record.phase is RepairPhase.REBOOTING
    # A real reboot may bring the node back DOWN (with the reason the loop gave it).
    if not (is_pending(state, reason) or (rebooted and state == "down"
                                           and reason.startswith(PENDING_PREFIX))):
        return _record(site, DeepCheckOutcome(node, slurmd_node, socket.gethostname(), False,
                                              "left", "not pending any more", "", reason))
    if record is None:
        record = RepairRecord(node, cause=flat_reason(reason), since=now())
    if is_request(record.cause):
        cfg = RepairConfig()  # one check, no reboot: see repair.is_request
    early = before_suite(record, boot, cfg, now())
    if early is RepairStep.WAIT:
        return DeepCheckOutcome(node, slurmd_node, socket.gethostname(), False, "left",
                                "reboot under way", "", reason)
    if early is not None:
        record.note("reboot", False, f"not seen within {cfg.reboot_timeout_s:g} s", now())
        return _finish(node, slurmd_node, slurm, site, cfg, record, early, False,
                       f"reboot not seen within {cfg.reboot_timeout_s:g} s", "", reason,
                       now())
    result = run_suite("resume", node, config=site)
    state_now, reason_now = slurm.node_state_reason(node)
    if reason_now != reason or state_now not in (*DRAINED_STATES, "down"):
        clear_record(state_dir)
        return _record(site, DeepCheckOutcome(
            node, slurmd_node, socket.gethostname(), result.admits, "left",
            f"reason changed while the suite ran: {reason_now!r}", result.run_id, reason))
    detail = "" if result.admits else flat_reason(result.admission_reason)
    record.note("revalidate" if rebooted else "deep_check", result.admits, detail, now())
    step = after_suite(record, result.admits, cfg)
    if step is RepairStep.REBOOT:
        why = _reboot(node, slurm, site, cfg, record, boot, detail, run, now())
        if not why:
            return _record(site, DeepCheckOutcome(
                node, slurmd_node, socket.gethostname(), result.admits, "rebooting",
                f"repair round {record.round} of {cfg.rounds}", result.run_id, reason),
                record)
        record.note("reboot", False, why, now())
        step, detail = round_over(record, cfg), detail or why
    return _finish(node, slurmd_node, slurm, site, cfg, record, step, result.admits,
                   detail, result.run_id, reason, now())


def _reboot(node: str, slurm: Slurm, site: SiteConfig, cfg: RepairConfig,
            record: RepairRecord, boot: str, detail: str,
            run: Callable[[list[str]], str] | None, now: float) -> str:
    """Issue the reboot; "" when issued, else why not. The record is saved first: the
    reboot may end this process."""
    why = detail or record.cause
    pending = drain_reason(f"repair {record.round}/{cfg.rounds} rebooting", why,
                           kind=ReasonKind.PENDING)
    record.phase, record.boot, record.since = RepairPhase.REBOOTING, boot, now
    record.reason = pending
    record.note("reboot", None, "issued", now)
    save_record(site.state_path(node), record)
    slurm.drain(node, pending)
    failed = (run or _run_reboot)(reboot_argv(cfg, node, pending))
    if failed:
        record.phase = RepairPhase.CHECK
        save_record(site.state_path(node), record)
    return failed


def _run_reboot(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=REBOOT_CALL_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"reboot command failed: {exc}"[:200]
    if out.returncode != 0:
        return (f"reboot command exited {out.returncode}: "
                f"{(out.stderr or out.stdout).strip()[-160:]}")
    return ""


def _finish(node: str, slurmd_node: str, slurm: Slurm, site: SiteConfig, cfg: RepairConfig,
            record: RepairRecord, step: RepairStep, passed: bool, detail: str, run_id: str,
            previous: str, now: float) -> DeepCheckOutcome:
    """Resume, start the next round, or hand the node to a human."""
    host = socket.gethostname()
    if step is RepairStep.RESUME:
        slurm.resume(node)
        clear_record(site.state_path(node))
        return _record(site, DeepCheckOutcome(node, slurmd_node, host, passed, "resumed", "",
                                              run_id, previous), record)
    if step is RepairStep.NEXT_ROUND:
        record.round += 1
        record.phase, record.boot, record.since = RepairPhase.CHECK, "", now
        why = drain_reason(f"repair {record.round}/{cfg.rounds}", detail or record.cause,
                           kind=ReasonKind.PENDING)
        record.reason = why
        save_record(site.state_path(node), record)
        slurm.drain(node, why)
        return _record(site, DeepCheckOutcome(node, slurmd_node, host, passed, "next_round",
                                              why, run_id, previous), record)
    why = failed_reason(f"{PREFIX} {detail or record.cause}")
    if cfg.rounds > 1:
        why = f"{why[:REASON_LIMIT - 24]} ({cfg.rounds} repair rounds)"
    record.reason, record.phase = why, RepairPhase.HUMAN
    save_record(site.state_path(node), record)  # kept: the rounds, for the human
    slurm.drain(node, why)
    return _record(site, DeepCheckOutcome(node, slurmd_node, host, passed, "drained", why,
                                          run_id, previous), record)


def _record(site: SiteConfig, outcome: DeepCheckOutcome,
            repair: RepairRecord | None = None) -> DeepCheckOutcome:
    record = make_record(DEEP_CHECK_SCHEMA, DEEP_CHECK_VERSION, asdict(outcome),
                         now=time.time())
    try:
        append_records(outcome_path(outcome.node, site), [record])
    except OSError as exc:  # bookkeeping only; the Slurm state is the outcome
        print(f"slurm_robust health_check: could not record the outcome: {exc}",
              file=sys.stderr)
    record_safely(ledger_events(outcome, repair), site,
                  warn=lambda text: print(f"slurm_robust health_check: {text}",
                                          file=sys.stderr))
    return outcome


def ledger_events(outcome: DeepCheckOutcome,
                  repair: RepairRecord | None = None) -> list[NodeEvent]:
    """The node-ledger rows of one outcome: the deep check's verdict, then the return to
    service, the reboot, the next round or the drain it led to (none for a node left
    alone). A step of the break-fix loop carries its round in the evidence."""
    if outcome.action == "left":
        return []
    evidence = {"reason": outcome.reason, "run_id": outcome.run_id,
                "previous_reason": outcome.previous_reason, "host": outcome.host}
    if repair is not None:
        evidence["repair"] = {"round": repair.round, "step": outcome.action}
    kind = EventKind.DEEP_CHECK_PASSED if outcome.passed else EventKind.DEEP_CHECK_FAILED
    # No suite ran (a reboot never seen ended the round): no deep-check row.
    out = [NodeEvent(outcome.node, kind, "health_check", evidence=evidence)] \
        if outcome.run_id else []
    if outcome.action == "resumed":
        out.append(NodeEvent(outcome.node, EventKind.RETURNED, "health_check",
                             evidence=evidence))
    elif outcome.action == "drained":
        out.append(NodeEvent(outcome.node, EventKind.DRAIN, "health_check",
                             evidence=evidence))
    elif outcome.action in ("rebooting", "next_round"):
        out.append(NodeEvent(outcome.node, EventKind.REPAIR, "health_check",
                             evidence=evidence))
    return out


def run_pending(node: str, site: SiteConfig, slurm: Slurm, err: TextIO = sys.stderr,
                detach: bool = True) -> int:
    """The HealthCheckProgram's work on a pending node (slurm_robust.health_check_program
    found it so): deep-check it in a detached child under the node's lock, and return it
    to service or keep it drained. Always 0, as the program."""
    in_child = False
    try:
        lock_fd = _try_lock(site.state_path(node))
        if lock_fd is None:
            return 0  # a deep check of this node is still running
        boot = boot_identity()  # before detaching: the parent is slurmd
        if detach:
            if not _detached():
                os.close(lock_fd)
                return 0
            in_child = True
        try:
            outcome = deep_check_and_return(node, node, slurm, site, boot)
            print(f"slurm_robust health_check: {node}: {outcome.action} {outcome.reason}",
                  file=err)
        finally:
            os.close(lock_fd)
    except (SlurmRobustError, OSError) as exc:
        print(f"slurm_robust health_check: {exc}", file=err)
    if in_child:
        os._exit(0)  # the detached child ends here
    return 0


def _try_lock(state_dir: Path) -> int | None:
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def _detached() -> bool:
    """Fork a session-less grandchild; True in it, False in the parent (which returns
    to slurmd at once). The lock descriptor is inherited, so the lock lives with it."""
    if os.fork() != 0:
        return False
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # slurmd reads the program's output until EOF: let it go
        os.dup2(devnull, fd)
    return True
