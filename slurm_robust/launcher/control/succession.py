"""What an agent does once it has lost the controller: follow, take over, or
requeue.

Called by the agent (node/agent.py) after ``heartbeat_timeout_s`` without an answer.
:func:`after_controller_loss` blocks until one of:

- ``FOLLOW``: ``controller.json`` names a newer term (another agent took over, or this
  agent's own old controller was replaced), or the controller answers again (it was
  late, not gone): reconnect and go on.
- ``TAKE_OVER``: this agent is the successor. Preference is by agent index, lowest
  first, among the persisted members other than the lost controller's agent: the agent
  in position ``p`` waits ``p * STAGGER_S`` and then tries; the term claim
  (failover.claim_term, ``O_EXCL``) makes the choice exact even if two try at once. It
  claims only once the old controller's lease is stale (it is gone or frozen); Slurm's
  view of the old node (``sinfo``, a short timeout) goes into the incident as evidence
  only, since Slurm marks a lost node down only after ``SlurmdTimeout`` (tens of seconds).
- ``REQUEUE``: the lease is stale and no spare is parked (the spare rung cannot help),
  the state predates failover, or no successor appeared within :data:`FAILOVER_BUDGET_S`
  of the lease going stale: the existing path (requeue.requeue_after_controller_loss)
  records the incident and requeues.

While the lease is fresh the controller lives (controller.py renews it from its own
thread for as long as its tick loop is late rather than frozen): the agent neither
replaces it nor requeues behind its back, however long that lasts, and tries every
:data:`PROBE_S` whether it answers again. A controller that lives but has lost this
agent decides about its node itself.
- ``FINISHED``: the run had already ended; the agent exits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import failover
from slurm_robust.launcher.control.state import RunState, load_state
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.wire_records import TakeoverEvidence
from slurm_robust.run_dir_trust import read_trusted_json
from slurm_robust.secure_fs import UnsafePathError
from slurm_robust.slurm import Slurm, SlurmCommandError
from slurm_robust.slurm.runner import RetryPolicy

log = logging.getLogger("slurm_robust.launcher.control.succession")

#: Delay between successive candidates (lowest index tries first).
STAGGER_S = 1.0
#: Longest wait for a successor, once the lease is stale, before the requeue rung.
FAILOVER_BUDGET_S = 30.0
#: While the lease is fresh: how often to try whether the controller answers again.
PROBE_S = 1.0
#: Slurm's view of the old node is evidence: asked once, briefly.
SLURM_QUERY = RetryPolicy(attempts=1, timeout_s=3.0)


class Outcome(StrEnum):
    FOLLOW = "follow"
    TAKE_OVER = "take_over"
    REQUEUE = "requeue"
    FINISHED = "finished"


@dataclass
class Succession:
    outcome: Outcome
    takeover: failover.Takeover | None = None


def read_controller(paths: RunPaths, step_key: str) -> failover.ControllerRecord | None:
    """This job step's ``controller.json`` (None: missing, unreadable or stale)."""
    try:
        info = read_trusted_json(paths.controller)
    except (OSError, ValueError, UnsafePathError):  # a planted one is no controller
        return None
    return info if isinstance(info, dict) and info.get("key") == step_key else None


def slurm_node_state(node: str | None) -> str | None:
    """Slurm's state of ``node`` (``idle``, ``mixed``, ``down``...), None when unknown."""
    if not node:
        return None
    try:
        return str(Slurm(policy=SLURM_QUERY).node(node).state)
    except (SlurmCommandError, Exception) as exc:  # noqa: BLE001 - evidence only
        log.info("Slurm's view of %s unavailable: %s", node, exc)
        return None


def after_controller_loss(cfg: RunConfig, ident: Identity, known_term: int,
                          clock: Callable[[], float] = time.time,
                          sleep: Callable[[float], None] = time.sleep,
                          node_state: Callable[[str | None], str | None] = slurm_node_state,
                          last_heard: float | None = None,
                          answers: Callable[[], bool] | None = None) -> Succession:
    """Decide (and, for TAKE_OVER, win the claim); see the module docstring.
    ``answers``: whether the controller passes a handshake now (the agent's probe)."""
    paths = RunPaths.of(cfg.run_dir)
    start = clock()
    probed = start
    lost = read_controller(paths, ident.step_key) or {}
    lost_agent = lost.get("agent")
    # The controller this agent lost is the one of its own term. A controller.json of a
    # newer term (an agent that was frozen while a successor took over) is followed.
    term = known_term
    while True:
        now = clock()
        state = load_state(paths.state)
        settled = _settled(state, paths, ident, term)
        if settled is not None:
            return settled
        age = failover.lease_age(paths, now)
        stale = age is None or age > cfg.heartbeat_timeout_s
        if not stale:
            # The controller still renews its lease: it lives (this agent alone lost
            # contact, or it is late); neither replace it nor requeue behind its back.
            start = now  # the budget counts from the lease going stale
            if answers is not None and now - probed >= PROBE_S:
                probed = now
                if answers():
                    log.info("agent %s: the controller answers again", ident.index)
                    return Succession(Outcome.FOLLOW)
            sleep(0.1)
            continue
        if not state.spares or not state.members or \
                str(ident.index) not in state.members:
            return Succession(Outcome.REQUEUE)
        if now - start >= _position(state, ident, lost_agent) * STAGGER_S and stale:
            won = _claim(paths, ident, term, lost, age, node_state, last_heard)
            if won is not None:
                return won
            # Someone else won this term: wait for its controller.json.
        if now - start > FAILOVER_BUDGET_S:
            log.warning("no successor controller within %.0f s; requeueing",
                        FAILOVER_BUDGET_S)
            return Succession(Outcome.REQUEUE)
        sleep(0.1)


def _settled(state: RunState, paths: RunPaths, ident: Identity,
             term: int) -> Succession | None:
    """The run is over (FINISHED), or a newer term's controller exists (FOLLOW)."""
    if state.finished:
        return Succession(Outcome.FINISHED)
    info = read_controller(paths, ident.step_key)
    if info is not None and int(info.get("term") or 0) > term:
        return Succession(Outcome.FOLLOW)
    return None


def _position(state: RunState, ident: Identity, lost_agent: Any) -> int:
    """This agent's place in the order of would-be successors (last: not one)."""
    order = failover.candidates(state.members, lost_agent)
    return order.index(ident.index) if ident.index in order else len(order)


def _claim(paths: RunPaths, ident: Identity, term: int, lost: failover.ControllerRecord,
           age: float | None, node_state: Callable[[str | None], str | None],
           last_heard: float | None) -> Succession | None:
    """Claim term + 1 for this agent: TAKE_OVER with the takeover's evidence, or None
    when another agent won the claim."""
    lost_agent, lost_node = lost.get("agent"), lost.get("node")
    who: failover.Claimant = {"agent": ident.index, "node": ident.node}
    if not failover.claim_term(paths, ident.step_key, term + 1, who):
        return None
    evidence: TakeoverEvidence = {
        "controller_lost": True, "detected_by": ident.node, "previous_term": term,
        "term": term + 1, "previous_agent": lost_agent,
        "lease_age_s": None if age is None else round(age, 3),
        "slurm_node_state": node_state(lost_node)}
    log.warning("agent %s on %s takes over as controller (term %s) from agent %s on %s",
                ident.index, ident.node, term + 1, lost_agent, lost_node)
    return Succession(Outcome.TAKE_OVER, failover.Takeover(
        term + 1, lost_agent if isinstance(lost_agent, int) else None, lost_node, evidence,
        last_heard))
