"""Fixed-key JSON records that more than one plane writes or reads, as TypedDicts.

A leaf (it imports nothing of the launcher): the node plane writes these into a report,
the control plane reads them back into an incident, and the typed messages
(messages.py) name them as field types, so they cannot live in a plane's module. The
JSON stays what docs/SCHEMAS.md documents; these only say its keys.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class ClassifierEvidence(TypedDict):
    """``evidence.classifier`` of an incident (docs/SCHEMAS.md): why this class."""

    rule: str
    strength: str
    line: str
    source: str
    side: str
    outranked: NotRequired[list[str]]  # other log rules that matched, weaker or later
    # A learned answer (rule "learned"): the model's probability for the class, the words
    # that raised it most, the model file's version, and the rules' own answer it replaced.
    probability: NotRequired[float]
    words: NotRequired[list[str]]
    model_version: NotRequired[int]
    rules_said: NotRequired[str]


class TaskExitRecord(TypedDict):
    """A ``slurm_robust.task_exit`` journal line (docs/SCHEMAS.md), written by root."""

    schema: str
    v: int
    time: float
    node: str
    job_id: str
    step_id: str
    task_id: int
    local_task_id: int
    pid: int
    wait_status: int
    exit_code: int | None
    signal: int | None
    core_dumped: bool
    restart_count: int


class TaskExitEvidence(TypedDict):
    """Which task the trusted task-exit record was; read with ``.get`` from a journal
    line, so a field an older plugin did not write is None."""

    node: str | None
    job_id: str | None
    step_id: str | None
    task_id: int | None
    wait_status: int | None


class NvmlReadings(TypedDict, total=False):
    """The GPU probes the classifier reads (slurm_robust.health.probes); none on a node
    without NVML."""

    xid_events: list[dict[str, int]]
    ecc_uncorrectable: list[int]
    gpu_count: int
    remap: list[dict[str, bool | int]]


class NvmlEvidence(TypedDict, total=False):
    """What of the NVML readings decided a hardware class (one of these keys)."""

    ecc_uncorrectable: list[int] | None
    remap: list[dict[str, bool | int]] | None
    gpu_count: int
    expected: int


class TakeoverEvidence(TypedDict):
    """How a successor took over from a lost controller (control/succession.py): the
    ``controller`` event's ``takeover``, merged into the lost agents' failures too."""

    controller_lost: bool
    detected_by: str
    previous_term: int
    term: int
    previous_agent: int | None
    lease_age_s: float | None
    slurm_node_state: str | None


class ExitEvidence(TypedDict, total=False):
    """A failed worker's ``evidence``: what the classifier wrote (each key only when its
    source said something), what the agent adds (``decided_by``, ``not_consulted``: the
    sources it could not read, and why); for a node the controller lost, how long it had
    been silent and whether its connection closed, and after a controller takeover the
    takeover's evidence (:class:`TakeoverEvidence`)."""

    exit_code: int | None
    signal: int | None
    signal_name: str
    task_exit: TaskExitEvidence
    nvml: NvmlEvidence
    xids: list[int]
    xid_cause: int
    kernel_hung_task: str
    kernel_oom: str
    kernel_line: str
    log_line: str
    exception: str
    message: str
    where: str
    progress_lines: int
    change_recorded: bool
    error_class: str
    classifier: ClassifierEvidence
    decided_by: str
    not_consulted: dict[str, str]
    heartbeat_age_s: float
    connection_closed: bool
    controller_lost: bool
    detected_by: str
    previous_term: int
    term: int
    previous_agent: int | None
    lease_age_s: float | None
    slurm_node_state: str | None


class FailedCheck(TypedDict):
    check: str
    reason: str
    evidence: dict[str, object]


class DiagnosisEvidence(TypedDict):
    """What a verdict or an incident records about one diagnosis."""

    node: str
    passed: bool
    complete: bool
    elapsed_s: float
    budget_s: float
    failed: list[FailedCheck]
    ran: list[str]


class StackSummary(TypedDict):
    """What an agent reports of one stack capture on its node (``Report.stacks``): the
    ranks it captured and why not, plus ``stacks.capture``'s summary once one ran."""

    ranks: list[int]
    error: str | None
    schema: NotRequired[str]
    v: NotRequired[int]
    time: NotRequired[float]
    capture_id: NotRequired[str]
    node: NotRequired[str]
    processes: NotRequired[int]
    methods: NotRequired[dict[str, int]]
    errors: NotRequired[dict[str, int]]
    duration_s: NotRequired[float]
