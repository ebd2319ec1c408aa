"""The run state that outlives a Slurm requeue: ``<run_dir>/state.json``.

Written atomically (temp file + rename) by the controller after every change that a
restarted controller must know: the attempt counter (one count across in-job restarts
and requeues), the restart count, error signatures seen (futile-restart detection),
failures per node, which node held which slot, the blamed nodes, and an incident left
open by a requeue (closed by the next allocation's controller once a step finishes).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict, cast

from slurm_robust.launcher.control.env_change import ChangeRecord, FingerprintRecord
from slurm_robust.launcher.control.nan_ladder import LadderState
from slurm_robust.launcher.messages import Incident, IncidentState
from slurm_robust.records import write_json_atomic
from slurm_robust.run_dir_trust import read_trusted_json

STATE_VERSION = 1


class StateRecord(TypedDict):
    """``state.json``: its version, then one key per RunState field in the field order
    (an open incident in the form ``Incident.state`` gives)."""

    v: int
    run_id: str
    attempt: int
    restarts: int
    requeues: int
    signatures: dict[str, int]
    diagnosis_passed: list[str]
    node_failures: dict[str, int]
    slots: list[str]
    blamed: list[str]
    given_nodes: list[str]
    last_step: int | None
    no_progress: int
    time_limit_step: int | None
    time_limits: int
    outage_since: float | None
    outage_failures: int
    outage_not_before: float | None
    restart_count: int | None
    slurm_ending_at: float | None
    open_incident: IncidentState | None
    incidents: int
    finished: str | None
    verdict: str | None
    term: int
    gen: int
    members: dict[str, str]
    spares: list[str]
    nan_ladder: LadderState | None
    fingerprint: FingerprintRecord | None
    env_change: ChangeRecord | None
    declares_phases: bool
    phase_times: dict[str, list[float]]
    hang_limits: dict[str, float]


@dataclass
class RunState:
    """Persisted facts about a run (see the module docstring)."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    attempt: int = -1
    restarts: int = 0
    requeues: int = 0
    signatures: dict[str, int] = field(default_factory=dict)
    # Signatures whose suspected node passed stop-time diagnosis: seen again, not the node.
    diagnosis_passed: list[str] = field(default_factory=list)
    node_failures: dict[str, int] = field(default_factory=dict)
    slots: list[str] = field(default_factory=list)
    blamed: list[str] = field(default_factory=list)
    # Every node an allocation of this run was given: Slurm takes a DOWN node
    # out of a --no-kill job, the run still answers for it (the epilog checks sacct).
    given_nodes: list[str] = field(default_factory=list)
    last_step: int | None = None
    no_progress: int = 0
    # The newest step when the previous allocation met its time limit (time_limit.py):
    # the same again at the next warning means an allocation that made no step.
    time_limit_step: int | None = None
    time_limits: int = 0
    # An external service down at start-up (outage.py): when its first failure was
    # decided, the start-up failures in a row so far, and the earliest time the next
    # generation may start (the backoff; None: none pending). A failure of another
    # class or a finished step clears them.
    outage_since: float | None = None
    outage_failures: int = 0
    outage_not_before: float | None = None
    # Slurm's requeue count (SLURM_RESTART_COUNT) of the allocation whose controller last
    # wrote this state: a higher one with no incident open is a requeue the launcher did
    # not make (external_requeue.py). None: a state from before the count was kept.
    restart_count: int | None = None
    # When an agent of the last allocation got SIGTERM (slurm_ending.py): Slurm ending
    # it; the next allocation's record of a requeue it did not expect starts there.
    slurm_ending_at: float | None = None
    open_incident: Incident | None = None
    incidents: int = 0
    finished: str | None = None
    verdict: str | None = None
    # Failover: the term of the controller that wrote this state (a successor
    # takes over at term + 1), the last plan generation it handed out (a successor starts
    # above it), the membership by agent index and the parked spares' nodes.
    term: int = 0
    gen: int = 0
    members: dict[str, str] = field(default_factory=dict)
    spares: list[str] = field(default_factory=list)
    # The NaN ladder (nan_ladder.NanLadder.to_state): an open episode and the
    # skipped batches, so a requeue does not replay a data NaN once more.
    nan_ladder: LadderState | None = None
    # Code/data changes made outside `slurm-robust update` (env_change.py): the
    # last allocation's fingerprint of the training command, and the change a new one
    # found (step reached, attempt, what differs).
    fingerprint: FingerprintRecord | None = None
    env_change: ChangeRecord | None = None
    # Hang limits per phase (control/phases.py): whether the workers ever declared a
    # phase (else the single hang rule applies), the durations observed per phase
    # (newest last), and the limits they gave at the last save (for `status`).
    declares_phases: bool = False
    phase_times: dict[str, list[float]] = field(default_factory=dict)
    hang_limits: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> StateRecord:
        out = {"v": STATE_VERSION, **asdict(self)}
        out["open_incident"] = self.open_incident.to_json() if self.open_incident else None
        # asdict gives one key per field, as StateRecord says (a test keeps them alike).
        return cast(StateRecord, out)

    @classmethod
    # open-ended: state.json as read (any version's keys); unknown ones are dropped
    def from_dict(cls, raw: dict[str, Any]) -> RunState:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in raw.items() if k in known}
        if kw.get("open_incident") is not None:
            kw["open_incident"] = Incident.from_json(kw["open_incident"],
                                                     "state.json open_incident")
        return cls(**kw)


def load_state(path: str | os.PathLike[str], owner: int | None = None) -> RunState:
    """The saved state, or a fresh one when there is none yet.

    A state file that is not valid JSON is an error (never silently reset: the restart
    budget would start over): raises ValueError naming the file. One that is not the
    run owner's (``owner``, default the caller), a link, or writable by others raises
    UntrustedRunDirError (run_dir_trust.py).
    """
    p = Path(path)
    try:
        raw = read_trusted_json(p, owner)
    except FileNotFoundError:
        return RunState()
    except ValueError as exc:
        raise ValueError(f"run state {p} is not valid JSON ({exc}); move it away to "
                         "start the restart budget afresh") from exc
    return RunState.from_dict(raw)


def save_state(path: str | os.PathLike[str], state: RunState) -> None:
    write_json_atomic(path, state.to_dict(), mode=0o600)
    # The rename is durable only once the directory entry is: a successor that takes
    # over after a crash must read this version, not the one before it.
    fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
