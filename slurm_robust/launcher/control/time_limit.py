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
stops the run with a verdict instead of requeueing for ever (run_facts.py counts,
ladder.py decides).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher.control.events import new_incident
from slurm_robust.launcher.enums import Category, IncidentClass
from slurm_robust.launcher.messages import Incident
from slurm_robust.launcher.worker_signals import WARNING_SIGNAL

log = logging.getLogger("slurm_robust.launcher.control.time_limit")

#: How often the job's end time is read from Slurm (an admin may extend the limit).
END_TIME_EVERY_S = 60.0


def job_end_time(job_id: str) -> float | None:
    """The job's end time as Slurm has it (start + time limit), or None (unlimited, or
    the job not found). One ``squeue`` call, with the client's timeout."""
    from slurm_robust.slurm import Slurm

    job = Slurm().job(job_id)
    return float(job.end_time) if job is not None and job.end_time > 0 else None


@dataclass
class TimeLimitWatch:
    """The allocation's warning: the first that came (an agent's report of Slurm's signal,
    or the job's end time ``warn_before_s`` away), and whether the detector has taken it
    (once per allocation: every later report carries the signal too).

    The end time is the backstop for the signal: Slurm 22.05 sends a requeued job's
    warning at its launch (measured from the previous allocation's end), before any
    agent listens, and then never again for that allocation."""

    warn_before_s: float = 60.0
    #: Reads the job's end time (Unix seconds); None: no clock, the signal only.
    fetch: Callable[[], float | None] | None = None
    warned_at: float | None = None
    node: str | None = None
    source: str | None = None
    taken: bool = False
    end_time: float | None = None
    checked_at: float | None = None
    _reader: threading.Thread | None = field(default=None, repr=False)

    def note(self, node: str | None, warned_at: float, source: str = "signal") -> None:
        if self.warned_at is None:
            self.warned_at, self.node, self.source = warned_at, node, source

    def refresh(self, now: float) -> None:
        """Read the end time again in a thread once END_TIME_EVERY_S has passed (never
        under the controller's lock: squeue may wait for a busy slurmctld)."""
        if self.fetch is None or (self._reader is not None and self._reader.is_alive()) \
                or (self.checked_at is not None and now - self.checked_at < END_TIME_EVERY_S):
            return
        self.checked_at = now
        fetch = self.fetch

        def read() -> None:
            try:
                end = fetch()
            except (SlurmRobustError, OSError) as exc:
                log.warning("the job's end time could not be read: %s", exc)
                return
            self.end_time = end  # one assignment: read by the detector under its lock

        self._reader = threading.Thread(target=read, name="job-end-time", daemon=True)
        self._reader.start()

    def due(self, now: float) -> bool:
        """Whether the end time (as last read) is within ``warn_before_s``: noted then."""
        end = self.end_time
        if end is not None and now >= end - self.warn_before_s:
            self.note(None, now, "end_time")
        return self.warned_at is not None

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
                        evidence={"time_limit": {
                            "source": watch.source, "first_node": watch.node,
                            "signal": WARNING_SIGNAL.name if watch.source == "signal" else None,
                            "warned_at": watch.warned_at, "end_time": watch.end_time,
                            "warn_before_s": watch.warn_before_s}})
