"""Detection thresholds, blame, rendezvous ports and slots, as pure functions.

Nothing here touches a process, a socket or Slurm: the controller gathers facts,
calls these functions, and the applier (applier.py) applies what they return:
decisions stay testable without a cluster. The ladder itself is ladder.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slurm_robust.launcher.classify import NODE_CLASSES
from slurm_robust.launcher.enums import IncidentClass, Rung
from slurm_robust.taxonomy import Side, node_side

RUNGS = tuple(Rung)
#: Step values needed before the spike test applies (early losses fall fast).
SPIKE_MIN_HISTORY = 8
#: Recent steps the medians are taken over.
WINDOW = 32
#: Classes that blame every node they name at once: node faults, and fail-slow (the
#: vote over several rounds already is the repeated evidence).
EVICTING_CLASSES = NODE_CLASSES | {IncidentClass.MFU_DECLINE}
#: Classes whose reporting rank says nothing about where the fault is: the loss and the
#: grad norm a script reports are taken after the all-reduce, the same on every rank, so
#: whichever rank tests them first reports the spike. They never count towards a node's
#: blame (a long run whose training turned unstable evicted a healthy node that way).
UNLOCALISED_CLASSES = frozenset({IncidentClass.LOSS_SPIKE})


def median(values: Sequence[float]) -> float | None:
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def hang_timeout(step_times: Sequence[float], floor_s: float, factor: float) -> float:
    """No finished step for this long is a hang: max(floor, factor x recent median)."""
    med = median(step_times[-WINDOW:])
    return floor_s if med is None else max(floor_s, factor * med)


#: A group with a rank past its last step (``finishing``: flushing its checkpoint pipeline,
#: writing the durable copy, meeting the others at the final barrier) is hung only after
#: this long: a save is not a step, and under load it took longer than an 8 s hang floor.
FINISH_TIMEOUT_S = 300.0


def is_hung(last_progress: float, now: float, step_times: Sequence[float], floor_s: float,
            factor: float, started: bool, startup_timeout_s: float,
            reports_steps: bool = True, finishing: bool = False) -> bool:
    """Whether the group is hung.

    started: this group finished a step (the hang timeout applies from its last one).
    finishing: a rank reported the end of training (FINISH_TIMEOUT_S applies).
    reports_steps: the run has ever reported a step (any rank, any attempt). A script
    that never reported one is not hung while its workers live (it is judged by exits,
    heartbeats and the live inspection only); one that did report steps gets
    ``startup_timeout_s`` for the first step of a (re)started group.
    """
    if finishing:
        return now - last_progress > max(FINISH_TIMEOUT_S,
                                         hang_timeout(step_times, floor_s, factor))
    if started:
        return now - last_progress > hang_timeout(step_times, floor_s, factor)
    if not reports_steps:
        return False
    return now - last_progress > startup_timeout_s


#: A group of a script that reports no steps, alive this long before it failed, counts as
#: having made progress (max_no_progress then stops only quick repeated failures).
SILENT_PROGRESS_S = 120.0


def made_progress(steps_done: int, reports_steps: bool, alive_s: float,
                  silent_progress_s: float = SILENT_PROGRESS_S) -> bool:
    """Whether a failed group advanced the run: it finished a step; or, for a run that
    never reports steps (progress unknown), it lived ``silent_progress_s``."""
    return steps_done > 0 or (not reports_steps and alive_s >= silent_progress_s)


def step_anomaly(history: Sequence[float], value: float | None, factor: float) -> str | None:
    """``"nan"`` for a non-finite value, ``"loss_spike"`` for one above factor x the
    recent median (once SPIKE_MIN_HISTORY values are known), else None."""
    if value is None:
        return None
    if not math.isfinite(value):
        return "nan"
    recent = [v for v in history[-WINDOW:] if v is not None and math.isfinite(v)]
    if len(recent) < SPIKE_MIN_HISTORY:
        return None
    med = median(recent)
    if med is not None and med > 0 and value > factor * med:
        return "loss_spike"
    return None


def blamed_nodes(cls: str, nodes: Sequence[str], failures_by_node: dict[str, int],
                 threshold: int, side: str | None = None) -> tuple[str, ...]:
    """Nodes named as culprits: every node for a node-class or fail-slow fault (unless
    the classifier called its side other than infrastructure: a GPU the job's own cgroup
    hides reads as "no driver", which only the node's checks can tell from a broken one,
    so that goes to stop-time diagnosis, as the classifier's ``diagnose`` action says),
    else, for a node-side class (taxonomy.node_side; ``side`` is the classifier's call),
    the nodes whose failure count in this run reached ``threshold``. Repeats of a
    user-side, unknown or off-node class blame nobody by count: see
    :func:`repeat_suspects`. ``side`` None: a detector's incident (a lost node, a hang,
    the fail-slow vote), whose class is its evidence."""
    if cls in EVICTING_CLASSES and side in (None, Side.INFRASTRUCTURE.value):
        return tuple(dict.fromkeys(nodes))
    if cls in UNLOCALISED_CLASSES or not node_side(cls, side):
        return ()
    return repeat_suspects(nodes, failures_by_node, threshold)


def unexplained_repeats(cls: str, nodes: Sequence[str], failures_by_node: dict[str, int],
                        threshold: int, side: str | None = None) -> tuple[str, ...]:
    """The named nodes where a class that is no evidence against a node by itself (user
    side, unknown, off-node) reached the repeat threshold: stop-time diagnosis on the
    node decides (stop_diagnosis.wants_diagnosis); the count alone never blames."""
    if cls in UNLOCALISED_CLASSES or node_side(cls, side) or \
            (cls in EVICTING_CLASSES and side in (None, Side.INFRASTRUCTURE.value)):
        return ()
    return repeat_suspects(nodes, failures_by_node, threshold)


def repeat_suspects(nodes: Sequence[str], failures_by_node: dict[str, int],
                    threshold: int) -> tuple[str, ...]:
    """The named nodes whose failure count in this run reached ``threshold``. For a class
    that is not node-side this is a reason to diagnose the node, not to blame it."""
    return tuple(n for n in dict.fromkeys(nodes) if failures_by_node.get(n, 0) >= threshold)


def assign_slots(previous: Sequence[str | None], available: Sequence[str],
                 n: int) -> tuple[list[str], list[str]]:
    """Place ``n`` active slots on ``available`` nodes, keeping every slot whose node is
    still there (its memory-tier snapshot is local), filling the rest in order.

    Returns (slot -> node, spare nodes). Raises ValueError when too few nodes.
    """
    if len(available) < n:
        raise ValueError(f"{len(available)} node(s) available, {n} needed")
    avail = list(dict.fromkeys(available))
    slots: list[str | None] = [None] * n
    used: set[str] = set()
    for i, node in enumerate(list(previous)[:n]):
        if node is not None and node in avail and node not in used:
            slots[i] = node
            used.add(node)
    free = [a for a in avail if a not in used]
    for i in range(n):
        if slots[i] is None:
            slots[i] = free.pop(0)
    return [s for s in slots if s is not None], free
