"""A requeue the launcher did not make: an administrator's (or the owner's) ``scontrol
requeue``, the scheduler's preemption (PreemptMode=REQUEUE), Slurm's own requeue after
a node failure.

Such an allocation ends without a word to the controller: Slurm signals every task at
once (SIGTERM, then SIGKILL KillWait or GraceTime seconds later), so the old allocation
records nothing. The next allocation's controller sees it: Slurm's requeue count
(``SLURM_RESTART_COUNT``) is above that of the allocation that last wrote state.json, and
no incident was left open by a requeue of the launcher's own (time limit, lost node). It
asks accounting how the previous allocation ended (``sacct --duplicates``: PREEMPTED,
REQUEUED, NODE_FAIL) and records the boundary as one incident of class ``preempted``,
``admin`` or ``node_lost`` that names no node and counts no restart, rung ``requeue``:
what Slurm did, recorded rather than decided by the ladder. The new allocation's first
step closes it as it closes every requeue's, so the post-mortem's allocations table says
what ended each allocation and ETTR counts the time from the previous allocation's end
(queue wait included) as that incident's downtime: from the SIGTERM an agent of it got
(slurm_ending.py, kept in state.json) when known, else accounting's end time.

The accounting read is a Slurm command (it waits for slurmdbd), so it runs in a thread
started with the controller and is only collected when the agents have gathered: the
controller's lock is never held across it. Under load slurmdbd can be slower than the
agents: no answer yet, or no ended record yet (the requeue is certain, Slurm's count says
so, so an empty answer means accounting lags and the read is repeated for a while). The
incident then opens as ``admin`` and takes the cause when the read answers, at the latest
when it is written (the first step of the new allocation); only a read that never answers
leaves it ``admin``, with the read's error as evidence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher.control.events import new_incident
from slurm_robust.launcher.enums import IncidentClass, Rung
from slurm_robust.launcher.messages import Incident
from slurm_robust.slurm.records import AcctJob
from slurm_robust.taxonomy import ROWS

log = logging.getLogger("slurm_robust.launcher.control.external_requeue")

#: Slurm's end state of an allocation -> the incident class that names the cause. Any
#: other ended state (REQUEUED: ``scontrol requeue``; REQUEUE_HOLD, CANCELLED...) is
#: ``admin``: someone with the power to requeue did.
CAUSES: dict[str, IncidentClass] = {
    "PREEMPTED": IncidentClass.PREEMPTED,
    "NODE_FAIL": IncidentClass.NODE_LOST,
    "TIMEOUT": IncidentClass.TIME_LIMIT,
}
#: What an allocation that has not ended shows (the current one, or a record in flux).
NOT_ENDED = frozenset({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "RESIZING",
                       "SUSPENDED", "REQUEUE_FED"})


@dataclass(frozen=True)
class AllocationEnd:
    """How Slurm's accounting says an earlier allocation of the job ended."""

    state: str           # the first word of sacct's State ("CANCELLED by 0" -> CANCELLED)
    ended_at: float | None
    nodes: tuple[str, ...]


def slurm_time(text: str) -> float | None:
    """sacct's local ISO time as Unix seconds (None for Unknown/None/empty)."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def previous_end(records: list[AcctJob]) -> AllocationEnd | None:
    """The most recently ended allocation among ``sacct -X --duplicates`` records of one
    job (None when none has ended)."""
    ended = []
    for rec in records:
        state = rec.state.split()[0] if rec.state.split() else ""
        if state and state not in NOT_ENDED:
            ended.append(AllocationEnd(state, slurm_time(rec.end), rec.nodes))
    if not ended:
        return None
    return max(ended, key=lambda e: e.ended_at if e.ended_at is not None else float("-inf"))


def read_previous_end(job_id: str) -> AllocationEnd | None:
    """How the job's previous allocation ended, from one ``sacct`` call (the client's
    timeout and retries)."""
    from slurm_robust.slurm import Slurm

    return previous_end(Slurm().sacct([job_id], ["--duplicates"]))


def requeued_outside(restart_count: int, saved_restart_count: int | None,
                     open_incident: Incident | None, finished: str | None) -> bool:
    """Whether this allocation follows a requeue the launcher did not make: Slurm's count
    rose since the state was written (None: a state from before the count was kept, never
    taken for a requeue), and no requeue of the launcher's own left its incident open (an
    incident open on another rung, an in-place restart say, was cut short by Slurm's)."""
    return (saved_restart_count is not None and restart_count > saved_restart_count
            and finished is None
            and (open_incident is None or open_incident.rung != Rung.REQUEUE))


#: How long the probe asks again while accounting has no ended record of the previous
#: allocation yet, and how often.
LAG_BUDGET_S = 60.0
LAG_RETRY_S = 2.0
NOT_ANSWERED = "sacct had not answered"


class PreviousEndProbe:
    """The accounting read of a new allocation, in its own thread (module docstring)."""

    def __init__(self, job_id: str, fetch: Callable[[str], AllocationEnd | None],
                 restart_count: int, saved_restart_count: int) -> None:
        self.restart_count, self.saved = restart_count, saved_restart_count
        self._end: AllocationEnd | None = None
        self._error: str | None = None
        self._done = threading.Event()

        def read() -> None:
            deadline = time.monotonic() + LAG_BUDGET_S
            try:
                while True:
                    self._end = fetch(job_id)
                    if self._end is not None or time.monotonic() >= deadline:
                        break
                    time.sleep(LAG_RETRY_S)
                if self._end is None:
                    self._error = (f"accounting had no ended allocation of job {job_id} "
                                   f"after {LAG_BUDGET_S:g} s")
            except (SlurmRobustError, OSError, ValueError) as exc:
                self._error = str(exc) or type(exc).__name__
                log.warning("how the previous allocation ended could not be read: %s", exc)
            finally:
                self._done.set()

        threading.Thread(target=read, name="previous-allocation-end", daemon=True).start()

    @property
    def answered(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        """For tests and tools: whether the read finished within ``timeout_s``."""
        return self._done.wait(timeout_s)

    def refine(self, incident: Incident) -> bool:
        """Give ``incident`` (opened by :meth:`incident` before the read answered) the
        cause the read has found since. Returns whether it changed; an incident opened
        with the answer, or a read still unanswered, is left alone."""
        evidence = incident.evidence.get("requeue", {})
        if evidence.get("error") != NOT_ANSWERED or not self.answered:
            return False
        fresh = self.incident(incident.incident, incident.last_step, incident.detected_at,
                              evidence.get("signalled_at"))
        incident.cls, incident.category = fresh.cls, fresh.category
        incident.evidence["requeue"] = fresh.evidence["requeue"]
        if incident.fault_time is None:
            incident.fault_time = fresh.fault_time
        return True

    def incident(self, incident_id: str, last_step: int | None, now: float,
                 signalled_at: float | None = None) -> Incident:
        """The boundary's incident, from whatever the read has found by ``now`` (module
        docstring); rung ``requeue``, localised at once (there is nothing to localise).
        ``signalled_at``: when an agent of the previous allocation got Slurm's SIGTERM
        (slurm_ending.py), the fault's time when known (accounting's end is later, after
        KillWait or GraceTime)."""
        end = self._end if self._done.is_set() else None
        error = self._error if self._done.is_set() else NOT_ANSWERED
        cls = CAUSES.get(end.state, IncidentClass.ADMIN) if end is not None \
            else IncidentClass.ADMIN
        evidence = {"requeue": {
            "by": "slurm", "slurm_state": end.state if end is not None else None,
            "ended_at": end.ended_at if end is not None else None,
            "previous_nodes": list(end.nodes) if end is not None else [],
            "restart_count": self.restart_count, "previous_restart_count": self.saved,
            "signalled_at": signalled_at,
            "source": "sacct" if end is not None else None,
            "error": None if end is not None else error}}
        ended = end.ended_at if end is not None else None
        incident = new_incident(incident_id, cls, ROWS[cls].category, now,
                                fault_time=signalled_at if signalled_at is not None else ended,
                                nodes=[], last_step=last_step, evidence=evidence)
        incident.localized_at = now
        return incident
