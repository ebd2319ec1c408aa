"""Slurm ending the allocation: what the controller does between SIGTERM and SIGKILL.

When Slurm ends a job's allocation (an administrator's ``scontrol requeue``, a
preemption, a cancel, the kill at the time limit, the controller's own requeue) it sends
SIGTERM to every task's process group at once, and SIGKILL KillWait seconds later
(GraceTime for a preemption). The workers die of the SIGTERM; the agents note it
(node/agent.py) and their next report says when (``Report.ending``). Those deaths are
no failure: recovering from them would count a restart, start workers Slurm is about to
kill, and (for the agents that go first) blame nodes for a lost heartbeat. So from the
first such report the controller decides nothing for :data:`HOLD_S` and records the time
in ``state.json`` (``slurm_ending_at``); the next allocation, if Slurm requeued the job,
records the boundary from it (external_requeue.py). Should the allocation outlive the
hold (a SIGTERM someone sent with ``scancel --signal=TERM`` that ended nothing), the
failures it caused are handled as any others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger("slurm_robust.launcher.control.slurm_ending")

#: How long the controller decides nothing after the first SIGTERM: above Slurm's
#: default KillWait (30 s) and the preemption GraceTime sites commonly give (up to a few
#: minutes), after which the allocation is gone in every case this is for.
HOLD_S = 300.0


@dataclass
class SlurmEnding:
    """The first SIGTERM an agent of this allocation reported, and where."""

    at: float | None = None
    node: str | None = None

    def note(self, node: str, at: float) -> bool:
        """Record an agent's SIGTERM; True for the allocation's first."""
        if self.at is not None:
            return False
        self.at, self.node = at, node
        log.warning("Slurm is ending this allocation (SIGTERM on %s): no recovery for "
                    "up to %.0f s", node, HOLD_S)
        return True

    def holds(self, now: float) -> bool:
        """Whether the controller must decide nothing now."""
        return self.at is not None and now - self.at < HOLD_S
