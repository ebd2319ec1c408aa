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
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.drain import DEEP_FAILED_PREFIX, PENDING_PREFIX, PREFIX
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.node_ledger import EventKind, NodeEvent
from slurm_robust.health.suite import run_suite
from slurm_robust.records import append_records, make_record
from slurm_robust.site_config import SiteConfig, load_site_config
from slurm_robust.slurm import Slurm, check_node_name

DEEP_CHECK_SCHEMA = "slurm_robust.deep_check"
DEEP_CHECK_VERSION = 1
OUTCOME_FILE = "deep_check.jsonl"
LOCK_FILE = ".deep_check.lock"
DRAINED_STATES = ("drained", "draining", "drain")


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


def is_pending(state: str, reason: str) -> bool:
    """Drained with our pending reason and no job left on it (``draining`` nodes still
    run jobs: a deep suite beside a job would disturb it and judge the node under load)."""
    return state == "drained" and reason.startswith(PENDING_PREFIX)


def failed_reason(suite_reason: str) -> str:
    """``slurm_robust: deep check failed: <check>: <evidence>`` from a suite's reason."""
    detail = suite_reason[len(PREFIX):].strip() if suite_reason.startswith(PREFIX) \
        else suite_reason
    return f"{DEEP_FAILED_PREFIX} {detail or 'unspecified'}"


def outcome_path(node: str, site: SiteConfig) -> Path:
    return site.state_path(node) / OUTCOME_FILE


def deep_check_and_return(node: str, slurmd_node: str, slurm: Slurm,
                          site: SiteConfig) -> DeepCheckOutcome:
    """Run the deep suite here for ``node`` and resume or re-drain it (see module doc)."""
    state, reason = slurm.node_state_reason(node)
    if not is_pending(state, reason):
        return _record(site, DeepCheckOutcome(node, slurmd_node, socket.gethostname(), False,
                                              "left", "not pending any more", "", reason))
    result = run_suite("resume", node, config=site)
    state_now, reason_now = slurm.node_state_reason(node)
    if reason_now != reason or state_now not in DRAINED_STATES:
        action, why = "left", f"reason changed while the suite ran: {reason_now!r}"
    elif result.admits:
        slurm.resume(node)
        action, why = "resumed", ""
    else:
        why = failed_reason(result.admission_reason)
        slurm.drain(node, why)
        action = "drained"
    return _record(site, DeepCheckOutcome(node, slurmd_node, socket.gethostname(),
                                          result.admits, action, why, result.run_id, reason))


def _record(site: SiteConfig, outcome: DeepCheckOutcome) -> DeepCheckOutcome:
    record = make_record(DEEP_CHECK_SCHEMA, DEEP_CHECK_VERSION, asdict(outcome),
                         now=time.time())
    try:
        append_records(outcome_path(outcome.node, site), [record])
    except OSError as exc:  # bookkeeping only; the Slurm state is the outcome
        print(f"slurm_robust health_check: could not record the outcome: {exc}",
              file=sys.stderr)
    record_safely(ledger_events(outcome), site,
                  warn=lambda text: print(f"slurm_robust health_check: {text}",
                                          file=sys.stderr))
    return outcome


def ledger_events(outcome: DeepCheckOutcome) -> list[NodeEvent]:
    """The node-ledger rows of one outcome: the deep check's verdict, then the return to
    service or the drain it led to (none for a node left alone)."""
    if outcome.action == "left":
        return []
    evidence = {"reason": outcome.reason, "run_id": outcome.run_id,
                "previous_reason": outcome.previous_reason, "host": outcome.host}
    kind = EventKind.DEEP_CHECK_PASSED if outcome.passed else EventKind.DEEP_CHECK_FAILED
    out = [NodeEvent(outcome.node, kind, "health_check", evidence=evidence)]
    if outcome.action == "resumed":
        out.append(NodeEvent(outcome.node, EventKind.RETURNED, "health_check",
                             evidence=evidence))
    elif outcome.action == "drained":
        out.append(NodeEvent(outcome.node, EventKind.DRAIN, "health_check",
                             evidence=evidence))
    return out


def main(environ: Mapping[str, str], err: TextIO = sys.stderr,
         detach: bool = True) -> int:
    """slurmd's HealthCheckProgram: deep-check this node if it is pending. Always 0: a
    failure here is reported, never a reason for slurmd to mark the node down."""
    in_child = False
    try:
        node = check_node_name(environ.get("SLURMD_NODENAME")
                               or socket.gethostname().split(".")[0])
        site = load_site_config()
        slurm = Slurm()
        state, reason = slurm.node_state_reason(node)
        if not is_pending(state, reason):
            return 0  # the common case: one sinfo call, nothing else
        lock_fd = _try_lock(site.state_path(node))
        if lock_fd is None:
            return 0  # a deep check of this node is still running
        if detach:
            if not _detached():
                os.close(lock_fd)
                return 0
            in_child = True
        try:
            outcome = deep_check_and_return(node, node, slurm, site)
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
