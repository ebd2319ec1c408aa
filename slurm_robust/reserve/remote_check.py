"""Deep checks that run on the node they judge, through Slurm.

The caller (``slurm-robust node resume``, ``reserve reconcile``) never runs the suite
itself: it drains the node with ``slurm_robust: pending deep check: <why>`` and waits,
within a budget, for the node's own slurmd to run slurm_robust's HealthCheckProgram
(slurm_robust.node_deep_check), which runs the deep suite on the node as root and either
resumes it or drains it with ``slurm_robust: deep check failed: <check>: <evidence>``.
The answer is read back from Slurm (the node's state and reason), so it works the same
from an admin's login host and from the controller.

Requesting needs Slurm's privilege to drain a node: root or a Slurm operator/admin
(sacctmgr AdminLevel); anyone else is refused before anything changes.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_robust import health
from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.drain import DEEP_FAILED_PREFIX, PENDING_PREFIX
from slurm_robust.health.repair import RESERVE_REQUEST
from slurm_robust.reserve.gate import DeepRun
from slurm_robust.site_config import SiteConfig
from slurm_robust.slurm import Slurm, SlurmCommandError, run_slurm_command
from slurm_robust.slurm.runner import NO_RETRY

DRAINED_STATES = ("drained", "draining", "drain")
POLL_S = 1.0
#: Added to the wait: the deep suite's own budget and Slurm's delays.
SUITE_ALLOWANCE_S = 90.0
OUR_PROGRAM = "health_check"
#: How long a node just returned by its check may take to read idle to the planner.
SETTLE_S = 10.0


class DeepCheckRequestError(SlurmRobustError):
    """A deep check on the node cannot be requested (privilege, Slurm configuration)."""


@dataclass(frozen=True)
class NodeCheckResult:
    """How a requested deep check ended, as Slurm shows it.

    ``done``: the node's own check answered within the budget; ``passed``: it returned the
    node to service; ``reason``: the node's reason at the end ("" when resumed).
    """

    node: str
    done: bool
    passed: bool
    reason: str
    waited_s: float


def caller_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def require_privilege(slurm: Slurm) -> None:
    """Root, or a Slurm operator/administrator; raises DeepCheckRequestError otherwise."""
    if os.geteuid() == 0:
        return
    user = caller_name()
    try:
        level = run_slurm_command(["sacctmgr", "-n", "-P", "show", "user", user,
                                   "format=adminlevel"], env=slurm.env,
                                  policy=NO_RETRY).stdout.strip()
    except SlurmCommandError:
        level = ""
    if level not in ("Operator", "Administrator"):
        raise DeepCheckRequestError(
            f"user {user!r} may not drain or resume nodes: run as root or as a Slurm "
            "operator (sacctmgr modify user NAME set adminlevel=operator)")


def wait_budget_s(slurm: Slurm) -> float:
    """How long to wait for the node's check: two HealthCheckIntervals and the suite.

    Raises DeepCheckRequestError when slurmd runs no slurm_robust HealthCheckProgram,
    since then nothing would ever answer.
    """
    conf = slurm.config()
    program = conf.get("HealthCheckProgram", "")
    interval = conf.get("HealthCheckInterval", "0").split()[0]
    if OUR_PROGRAM not in os.path.basename(program) or not interval.isdigit() \
            or int(interval) == 0:
        raise DeepCheckRequestError(
            "the deep check runs on the node through slurmd's HealthCheckProgram, but "
            f"slurm.conf has HealthCheckProgram={program or '(none)'} "
            f"HealthCheckInterval={interval}; set it to slurm_robust's health_check "
            "wrapper (docs/ADMIN_GUIDE.md, 'slurm.conf and the node programs')")
    return 2 * int(interval) + SUITE_ALLOWANCE_S


def request(slurm: Slurm, node: str, why: str) -> None:
    """Drain ``node`` as pending its deep check (its slurmd's health check picks it up)."""
    slurm.drain(node, f"{PENDING_PREFIX} {why}")


def wait_result(slurm: Slurm, node: str, timeout_s: float,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> NodeCheckResult:
    """Poll the node until its pending reason is answered or ``timeout_s`` passes."""
    start = clock()
    reason = ""
    while True:
        state, reason = slurm.node_state_reason(node)
        waited = clock() - start
        if state not in DRAINED_STATES:
            return NodeCheckResult(node, True, True, "", waited)
        if not reason.startswith(PENDING_PREFIX):
            # Failed (ours), or someone else's reason replaced ours: either way not passed.
            return NodeCheckResult(node, reason.startswith(DEEP_FAILED_PREFIX), False,
                                   reason, waited)
        if waited >= timeout_s:
            return NodeCheckResult(node, False, False, reason, waited)
        sleep(POLL_S)


def check_on_node(slurm: Slurm, node: str, why: str,
                  timeout_s: float | None = None) -> NodeCheckResult:
    """Request the deep check on ``node`` and wait for its answer (see module doc)."""
    require_privilege(slurm)
    budget = wait_budget_s(slurm) if timeout_s is None else timeout_s
    request(slurm, node, why)
    return wait_result(slurm, node, budget)


class SlurmNodeGate:
    """The reserve's HealthGate with deep runs on the node itself, through Slurm.

    Reads (last pass, journal) come from the node journals readable here; a deep run
    drains the idle node as pending and waits for its own check.
    """

    def __init__(self, site: SiteConfig, slurm: Slurm, timeout_s: float | None = None) -> None:
        self.site = site
        self.slurm = slurm
        self.timeout_s = timeout_s

    def last_deep_pass(self, node: str) -> float | None:
        return health.last_deep_pass(node, config=self.site)

    def journal(self, node: str) -> list[dict[str, Any]]:
        return health.read_journal(node, config=self.site)

    def run_deep(self, node: str) -> DeepRun:
        try:
            res = check_on_node(self.slurm, node, RESERVE_REQUEST, self.timeout_s)
        except DeepCheckRequestError as exc:
            return DeepRun(node, False, False, str(exc))
        if not res.done:
            return DeepRun(node, False, False,
                           f"no deep check answer from {node} within {res.waited_s:.0f} s; "
                           "it stays drained pending its check")
        if res.passed:
            self._settle(node)
        return DeepRun(node, True, res.passed, res.reason)

    def _settle(self, node: str, timeout_s: float = SETTLE_S) -> None:
        """Wait (bounded) until the node reads idle in the view the reserve plans from
        (``sinfo --json``), so the next snapshot sees the node its check returned: Slurm
        22.05 shows a just-resumed node NOT_RESPONDING for about a second (seen on the
        mini-cluster), which made reconcile pass over the node it had just checked."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.slurm.nodes([node])
            if found and found[0].idle:
                return
            time.sleep(POLL_S / 4)
