"""Set DOWN the drained nodes of a requeued job whose slurmd no longer answers.

A requeued job stays COMPLETING until every node of its old allocation has run its
epilog. A node whose slurmd died never does; Slurm ends the wait only when it marks the
node DOWN itself, after ``SlurmdTimeout`` (300 s by default) and a ping cycle. Until then
the job cannot start again, spares or not: on the mini-cluster (SlurmdTimeout=15) that
was 20 s of every kill-node requeue, on a default-configured site up to five minutes.
Admins clear such jobs by hand with ``scontrol update nodename=X state=down``; this does
the same at job end for the nodes that need it, and for no other:

- only nodes the job's verdicts name (validated against its allocation, handoff.py) or
  that Slurm already took out of it;
- only nodes drained with slurm_robust's own reason (setting DOWN re-stamps the reason
  with SlurmUser, and an admin's drain must keep its author) and not DOWN already;
- only when the node's own slurmd refuses or ignores a TCP connection to its address and
  port (``sinfo``'s ``address``/``port``), which a job cannot fake: a node whose slurmd
  is up keeps its job's epilog and is never set DOWN here.

DOWN keeps the drain: on 22.05 a node set DOWN while drained reads ``DOWN+DRAIN`` and,
once its slurmd registers again, ``IDLE+DRAIN`` with the same reason, so it returns to
service only through the deep check, never through ``ReturnToService``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from slurm_robust.health.drain import PREFIX
from slurm_robust.slurm import Slurm, SlurmCommandError
from slurm_robust.slurm.records import Node

log = logging.getLogger("slurm_robust.reserve")

#: How long a slurmd has to accept a TCP connection before it counts as gone. A live
#: slurmd is accepted by the kernel's listen queue, however busy the daemon is.
PROBE_TIMEOUT_S = 2.0
#: Probes run side by side: a job's verdicts are bounded by its blame cap, and a dead
#: node costs the whole timeout.
PROBE_WORKERS = 16

#: ``(address, port, timeout_s) -> answers``: the injection point unit tests use; the
#: real one is :func:`slurmd_answers`.
Probe = Callable[[str, int, float], bool]


@dataclass(frozen=True)
class DownOutcome:
    node: str
    ok: bool
    why: str
    error: str = ""


def slurmd_answers(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection at ``address:port`` within
    ``timeout_s`` (refused, unreachable or silent: False)."""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def down_unreachable(slurm: Slurm, names: Iterable[str], probe: Probe = slurmd_answers,
                     timeout_s: float = PROBE_TIMEOUT_S) -> list[DownOutcome]:
    """Set DOWN, keeping their drain reason, the drained ``names`` whose slurmd does not
    answer; returns one outcome per node set (or failed to set) DOWN."""
    wanted = sorted(set(names))
    if not wanted:
        return []
    try:
        candidates = [n for n in slurm.nodes(wanted) if _eligible(n)]
    except SlurmCommandError as exc:
        log.warning("cannot tell which drained nodes lost their slurmd: %s", exc)
        return []
    if not candidates:
        return []
    with ThreadPoolExecutor(max_workers=min(PROBE_WORKERS, len(candidates))) as pool:
        answers = list(pool.map(lambda n: probe(n.address, n.port, timeout_s), candidates))
    out = []
    for node, answers_now in zip(candidates, answers, strict=True):
        if answers_now:
            continue
        why = (f"its slurmd at {node.address}:{node.port} does not answer; DOWN now ends "
               "the requeued job's wait for its epilog (Slurm would after SlurmdTimeout)")
        try:
            slurm.update_node(node.name, "down", node.reason)
            out.append(DownOutcome(node.name, True, why))
        except SlurmCommandError as exc:
            out.append(DownOutcome(node.name, False, why, str(exc)))
    return out


def _eligible(node: Node) -> bool:
    return (node.drained and node.state != "down" and node.reason.startswith(PREFIX)
            and bool(node.address) and node.port > 0)
