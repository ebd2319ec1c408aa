"""One start of the worker group as the recovery owner tracks it, and what it reads of
an agent.

:class:`Generation` is the running generation's record (slots, progress, failures, a
pending capture or diagnosis); the applier (applier.py) starts it, the recovery owner
records reports into it and the detectors read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from slurm_robust.ckpt.config import TIERS
from slurm_robust.launcher.control.failover import Takeover
from slurm_robust.launcher.control.monitor import IdleHang
from slurm_robust.launcher.messages import Incident, Progress, WorkerExit
from slurm_robust.launcher.wire_records import StackSummary


class Member(Protocol):
    """What recovery reads of one agent (the controller's membership record)."""

    index: int
    node: str
    addr: str
    last_seen: float
    lost: bool
    stacks: dict[str, StackSummary]
    states: dict[str, str | None]


@dataclass
class Failure:
    """A worker exit of the current generation as the controller saw it."""

    exit: WorkerExit
    node: str
    agent: int
    seen: float  # when the controller first heard of it


class HangLimit(TypedDict):
    """Why a group is hung: the phase it was in and that phase's limit (phases.py)."""

    phase: str
    limit_s: float


@dataclass
class PendingDiagnosis:
    """A stop-time diagnosis asked of one agent; the incident waits for its answer."""

    id: str
    agent: int
    node: str
    incident: Incident
    signature: str | None
    asked_at: float
    deadline: float
    side: str | None = None  # the root failure's side, for the ladder after the answer


@dataclass
class Generation:
    """One start of the worker group: the plan's generation and what it has done."""

    number: int
    attempt: int
    slots: list[int]
    started_at: float
    last_progress: float = 0.0
    steps_done: int = 0
    restored: dict[int, tuple[int | None, str | None]] = field(default_factory=dict)
    pending: dict[int, dict[int, Progress]] = field(default_factory=dict)
    finals: dict[int, Progress] = field(default_factory=dict)
    finishing: set[int] = field(default_factory=set)  # ranks that reported the end
    succeeded: set[int] = field(default_factory=set)
    failures: list[Failure] = field(default_factory=list)
    exits_seen: set[tuple[int, int]] = field(default_factory=set)
    first_failure_seen: float | None = None
    capture: str | None = None
    hang_detected: float | None = None
    # The monitor's implicit-hang evidence (idle GPUs, silent RDMA ports), when it was
    # the monitor and not a missing step report that declared the hang.
    hang_signal: IdleHang | None = None
    capture_deadline: float = 0.0
    announced: bool = False
    diagnosis: PendingDiagnosis | None = None
    #: Each rank's anomaly line (the NaN ladder: where a NaN began).
    # open-ended: the line's keys are what the training script wrote (Progress.extra)
    anomalies: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Each rank's bitwise reference digest, when this attempt was asked for one.
    bitwise: dict[int, str] = field(default_factory=dict)
    # Declared phases (control/phases.py): each rank's phase other than steps, how many
    # ranks are in each, when its episode began, and whether one began or ended since
    # the last step (that step's time is no step time).
    rank_phase: dict[int, str] = field(default_factory=dict)
    phase_counts: dict[str, int] = field(default_factory=dict)
    phase_began: dict[str, float] = field(default_factory=dict)
    phase_moved: bool = False
    #: The phase and limit a hang was declared under, for its incident.
    hang_limit: HangLimit | None = None

    def __post_init__(self) -> None:
        self.last_progress = self.last_progress or self.started_at
        self._slot_of: dict[int, int] = {}
        self._slot_of_list: list[int] | None = None

    def slot_of(self, agent_index: int) -> int | None:
        """The slot ``agent_index`` holds in this generation (None: not one of its).

        A dict built once per slots list: ``slots.index`` and ``in slots`` are linear, and
        the tick and every report asked them for each agent (quadratic in the nodes)."""
        if self._slot_of_list is not self.slots or len(self._slot_of) != len(self.slots):
            self._slot_of = {index: slot for slot, index in enumerate(self.slots)}
            self._slot_of_list = self.slots
        return self._slot_of.get(agent_index)


def new_exits(gen: Generation, member: Member,
               exits: Sequence[WorkerExit]) -> list[WorkerExit]:
    """The exits of ``gen`` in an agent's report not seen before (agents repeat them
    until acknowledged); marks them seen."""
    fresh = []
    for ex in exits:
        seen = (member.index, ex.rank)
        if ex.gen == gen.number and seen not in gen.exits_seen:
            gen.exits_seen.add(seen)
            fresh.append(ex)
    return fresh


def note_takeover(gen: Generation, takeover: Takeover) -> None:
    """The lost agents' failures carry the takeover's evidence; the old controller's
    agent failed when the successor last heard of it."""
    for failure in gen.failures:
        failure.exit.evidence.update(takeover.evidence)
        if takeover.last_heard is not None and failure.agent == takeover.lost_agent:
            # Its fault time: the successor's last contact (it may have reported again
            # since, a frozen process resumed).
            failure.exit = dataclasses.replace(failure.exit, time=takeover.last_heard)


def restored_of(gen: Generation) -> tuple[int | None, str | None]:
    """The common restored step and the slowest tier that served a rank."""
    steps = {s for s, _ in gen.restored.values()}
    tiers = [t for _, t in gen.restored.values() if t in TIERS]
    step = steps.pop() if len(steps) == 1 else (min((s for s in steps if s is not None),
                                                    default=None))
    tier = max(tiers, key=TIERS.index) if tiers else None
    return step, tier
