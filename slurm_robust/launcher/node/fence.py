"""Self-fencing of an agent that lost its controller.

An agent that no longer hears the controller cannot tell from that alone whether the
controller's node died or its own node was cut off (a network partition: the node alive,
its link down). Acting as if the controller's node died would, from a partitioned node,
blame a healthy node, write the run's state and requeue a job that is recovering without
it. So before it acts, the agent asks Slurm's controller: if slurmctld does not answer
either, this node is the one cut off, and the agent stands down: its workers are already
stopped, it writes nothing into the run (state, events, verdicts, checkpoints) and exits.
The controller has meanwhile declared it lost and given its slot to a spare; should the
link come back first, the controller tells it to stand down instead (controller.py).

Known limit: an asymmetric partition (slurmctld reachable, the controller's node not)
still reads as the controller's node lost.
"""

from __future__ import annotations

import logging
import os

from slurm_robust.launcher.identity import Identity
from slurm_robust.slurm import Slurm

log = logging.getLogger("slurm_robust.launcher.node.fence")


def standing_down(ident: Identity) -> bool:
    """Whether this agent must stand down instead of handling a lost controller: it runs
    under Slurm and Slurm's controller does not answer it either."""
    if ident.job_id == "local" or not os.environ.get("SLURM_JOB_ID"):
        return False  # outside Slurm there is nobody else to ask
    if Slurm().ping():
        return False
    log.warning("agent %s on %s: neither the run's controller nor slurmctld answers; this "
                "node is cut off, standing down without touching the run", ident.index,
                ident.node)
    return True
