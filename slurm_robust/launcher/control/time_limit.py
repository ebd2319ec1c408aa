"""The allocation's time limit: Slurm's warning signal becomes one ``time_limit`` incident.

The job is submitted with ``--signal=28@S`` (SIGWINCH, ``submit --warn-before S``, 60
by default; worker_signals.py says why not submitit's USR2); every agent notes the
signal (node/agent.py) and its next report carries the time (``Report.warned``). The
first one an allocation's controller hears is taken once, by the running phase's detector
(detectors.py): an incident of class ``time_limit`` that names no node, and the ladder
requeues the job (ladder.py) without counting a restart against the budget. The workers'
newest step is in the memory tier of every node, so the next allocation goes on from it
when Slurm gives the same nodes back, else from the peer, node-local or durable copy. An
allocation that made no step between two warnings (a start slower than the allocation)
stops the run with a verdict instead of requeueing for ever (ladder.py, ``no_progress``).
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_robust.launcher.control.events import new_incident
from slurm_robust.launcher.enums import Category, IncidentClass
from slurm_robust.launcher.messages import Incident
from slurm_robust.launcher.worker_signals import WARNING_SIGNAL


@dataclass
class TimeLimitWatch:
    """The allocation's warning: the first report that carried one, and whether the
    detector has taken it (once per allocation: every later report carries it too)."""

    warned_at: float | None = None
    node: str | None = None
    taken: bool = False

    def note(self, node: str, warned_at: float) -> None:
        if self.warned_at is None:
            self.warned_at, self.node = warned_at, node

    def take(self) -> bool:
        """True once, for the first warning heard."""
        if self.warned_at is None or self.taken:
            return False
        self.taken = True
        return True


def time_limit_incident(incident_id: str, watch: TimeLimitWatch, last_step: int | None,
                        now: float) -> Incident:
    """The ``time_limit`` incident of ``watch``'s warning: no node named (the scheduler's
    clock is no node's fault), the warning's time as the fault's."""
    return new_incident(incident_id, IncidentClass.TIME_LIMIT, Category.MANUAL, now,
                        fault_time=watch.warned_at, nodes=[], last_step=last_step,
                        evidence={"time_limit": {"signal": WARNING_SIGNAL.name,
                                                 "first_node": watch.node,
                                                 "warned_at": watch.warned_at}})
