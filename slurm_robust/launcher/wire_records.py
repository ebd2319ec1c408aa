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


class ExitEvidence(TypedDict, total=False):
    """A failed worker's ``evidence`` as the classifier writes it (each key only when its
    source said something), plus what the agent adds: ``decided_by`` and
    ``not_consulted`` (the sources it could not read, and why)."""

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
