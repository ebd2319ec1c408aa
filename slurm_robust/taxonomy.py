"""The failure taxonomy (ByteRobust Table 1 plus user-code and launcher classes).

One table, shared by the classifier (slurm_robust.launcher.classify), the ladder
(slurm_robust.launcher.control.policy), the post-mortem (slurm_robust.analysis) and the benchmark:
class -> category (explicit / implicit / manual) -> side (infrastructure / user /
unknown) -> default action. docs/SCHEMAS.md prints the same table.

A leaf module: it imports nothing from the project, so every layer may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Category(StrEnum):
    """How the failure shows itself (ByteRobust Table 1's columns)."""

    EXPLICIT = "explicit"  # a process dies or a component reports an error
    IMPLICIT = "implicit"  # the job keeps running but is wrong (hang, NaN, slow)
    MANUAL = "manual"      # a person restarted the job (code or data change)


class Side(StrEnum):
    """Whose fault it is: decides eviction (infrastructure) versus stop (user)."""

    INFRASTRUCTURE = "infrastructure"
    USER = "user"
    UNKNOWN = "unknown"


class Locus(StrEnum):
    """Where an infrastructure fault of the class lives, if it is one: on the node that
    reported it, or in a service the node only uses. Only a node-side fault is evidence
    against the node when it repeats there; an outage of shared storage or a web service
    repeats on whichever node asks, so its count says nothing about that node."""

    NODE = "node"
    OFF_NODE = "off_node"


class Action(StrEnum):
    """The default first response to a class (the ladder may still escalate)."""

    EVICT = "evict"              # the node is the culprit: spare or requeue without it
    DIAGNOSE = "diagnose"        # stop-time diagnosis on the suspected node decides
    REATTEMPT = "reattempt"      # restart in place; transient or not the node's fault
    ROLLBACK = "rollback"        # restore an earlier snapshot (bad numerics)
    STOP_ON_REPEAT = "stop_on_repeat"  # user code: retry once, stop if it repeats


class FailureClass(StrEnum):
    # ByteRobust Table 1, explicit
    CUDA_ERROR = "cuda_error"
    CPU_OVERLOAD = "cpu_overload"
    CPU_OOM = "cpu_oom"
    DISK_FULL = "disk_full"
    DISK_FAULT = "disk_fault"
    NETWORK = "network"
    FILESYSTEM_MOUNT = "filesystem_mount"
    REMOTE_STORAGE = "remote_storage"
    CONTAINER_RUNTIME = "container_runtime"
    EXTERNAL_SERVICE = "external_service"
    KERNEL_PANIC = "kernel_panic"
    GPU_MEMORY_ERROR = "gpu_memory_error"
    GPU_UNAVAILABLE = "gpu_unavailable"
    # ByteRobust Table 1, implicit
    JOB_HANG = "job_hang"
    MFU_DECLINE = "mfu_decline"
    NAN = "nan"
    # ByteRobust Table 1, manual
    CODE_DATA_CHANGE = "code_data_change"
    # user code
    USER_EXCEPTION = "user_exception"
    USER_CUDA_FAULT = "user_cuda_fault"
    GPU_OOM = "gpu_oom"
    BAD_CONFIG = "bad_config"
    # our own
    NODE_LOST = "node_lost"
    WORKER_SIGNAL = "worker_signal"
    LOSS_SPIKE = "loss_spike"
    ADMIN = "admin"
    TIME_LIMIT = "time_limit"
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class TaxonomyRow:
    cls: FailureClass
    category: Category
    side: Side
    action: Action
    table1: str | None  # ByteRobust Table 1's name for it; None: not in Table 1
    meaning: str
    locus: Locus = Locus.NODE


_E, _I, _M = Category.EXPLICIT, Category.IMPLICIT, Category.MANUAL
_INF, _USR, _UNK = Side.INFRASTRUCTURE, Side.USER, Side.UNKNOWN
F = FailureClass

TABLE: tuple[TaxonomyRow, ...] = (
    TaxonomyRow(F.CUDA_ERROR, _E, _UNK, Action.DIAGNOSE, "CUDA error",
                "a CUDA error that user code or the GPU may have caused (illegal address, "
                "launch failure, application Xid 13/31/43/45)"),
    TaxonomyRow(F.CPU_OVERLOAD, _E, _INF, Action.DIAGNOSE, "CPU overload",
                "the host cannot start threads or processes, or is starved of CPU"),
    TaxonomyRow(F.CPU_OOM, _E, _USR, Action.STOP_ON_REPEAT, "CPU OOM",
                "host memory exhausted: the OOM killer, MemoryError, std::bad_alloc"),
    TaxonomyRow(F.DISK_FULL, _E, _INF, Action.DIAGNOSE, "Disk full",
                "no space left on device (node-local disk: the check fails; shared: not)"),
    TaxonomyRow(F.DISK_FAULT, _E, _INF, Action.EVICT, "Disk fault",
                "I/O errors from a local disk, a file system remounted read-only by errors"),
    TaxonomyRow(F.NETWORK, _E, _INF, Action.DIAGNOSE, "Infiniband/network",
                "NCCL/verbs/UCX transport errors, retry counters exceeded, links down"),
    TaxonomyRow(F.FILESYSTEM_MOUNT, _E, _INF, Action.DIAGNOSE, "File-system mount",
                "a mount point is gone or stale (transport endpoint, stale handle)"),
    TaxonomyRow(F.REMOTE_STORAGE, _E, _INF, Action.REATTEMPT, "Remote storage",
                "HDFS, S3, Lustre, NFS or a cloud drive fails to serve I/O", Locus.OFF_NODE),
    TaxonomyRow(F.CONTAINER_RUNTIME, _E, _INF, Action.REATTEMPT, "Container/runtime",
                "the container or runtime environment: shm too small, OCI/enroot errors"),
    TaxonomyRow(F.EXTERNAL_SERVICE, _E, _INF, Action.REATTEMPT, "External service",
                "a service outside the cluster (model hub, tracker, API) fails",
                Locus.OFF_NODE),
    TaxonomyRow(F.KERNEL_PANIC, _E, _INF, Action.EVICT, "Kernel panic",
                "the node's kernel panicked, oopsed or locked up"),
    TaxonomyRow(F.GPU_MEMORY_ERROR, _E, _INF, Action.EVICT, "GPU memory error",
                "uncorrectable ECC, row-remap failure, hardware Xid 48/63/64/92/94/95"),
    TaxonomyRow(F.GPU_UNAVAILABLE, _E, _INF, Action.EVICT, "GPU unavailable",
                "GPU fallen off the bus (Xid 79), NVLink/GSP Xid 74/119/120, NVML fails"),
    TaxonomyRow(F.JOB_HANG, _I, _UNK, Action.DIAGNOSE, "Job hang",
                "no progress: collective watchdog timeout, hang detector"),
    TaxonomyRow(F.MFU_DECLINE, _I, _INF, Action.EVICT, "MFU decline",
                "fail-slow: one rank's group persistently slower (evicted after a vote)"),
    TaxonomyRow(F.NAN, _I, _UNK, Action.ROLLBACK, "NaN value",
                "non-finite loss or gradients"),
    TaxonomyRow(F.CODE_DATA_CHANGE, _M, _USR, Action.STOP_ON_REPEAT, "Code/data change",
                "the user restarted the job with new code or data; a user-side failure, "
                "or an exit with no named cause, soon after a recorded change (hot "
                "update, or code or packages changed between allocations)"),
    TaxonomyRow(F.USER_EXCEPTION, _E, _USR, Action.STOP_ON_REPEAT, None,
                "an exception raised by the training code"),
    TaxonomyRow(F.USER_CUDA_FAULT, _E, _USR, Action.STOP_ON_REPEAT, None,
                "a CUDA fault of the user's making: device-side assert, index out of range"),
    TaxonomyRow(F.GPU_OOM, _E, _USR, Action.STOP_ON_REPEAT, None,
                "GPU memory exhausted by the model (CUDA out of memory)"),
    TaxonomyRow(F.BAD_CONFIG, _E, _USR, Action.STOP_ON_REPEAT, None,
                "bad configuration: wrong path, memlock limit, read-only target, arguments"),
    TaxonomyRow(F.NODE_LOST, _E, _INF, Action.EVICT, None,
                "the node's agent stopped reporting (node down, network partition)"),
    TaxonomyRow(F.WORKER_SIGNAL, _E, _UNK, Action.REATTEMPT, None,
                "a worker killed by a signal, or exited, with no evidence of why"),
    TaxonomyRow(F.LOSS_SPIKE, _I, _UNK, Action.ROLLBACK, None,
                "loss or grad norm far above the recent median"),
    TaxonomyRow(F.ADMIN, _M, _INF, Action.REATTEMPT, None,
                "an administrator (or the job's owner) stopped, moved or requeued the "
                "job (`scontrol requeue`): it goes on from its newest step",
                Locus.OFF_NODE),
    TaxonomyRow(F.TIME_LIMIT, _M, _INF, Action.REATTEMPT, None,
                "the allocation's time limit is near (Slurm's warning signal): the job "
                "requeues itself and goes on from its newest step", Locus.OFF_NODE),
    TaxonomyRow(F.PREEMPTED, _M, _INF, Action.REATTEMPT, None,
                "the scheduler preempted the job for higher-priority work "
                "(PreemptMode=REQUEUE): it waits in the queue and goes on from its "
                "newest step", Locus.OFF_NODE),
)

ROWS: dict[FailureClass, TaxonomyRow] = {row.cls: row for row in TABLE}
CATEGORIES: tuple[str, ...] = tuple(c.value for c in Category)
#: Every class name, grouped by category in table order.
CLASSES: tuple[str, ...] = tuple(row.cls.value for cat in Category for row in TABLE
                                 if row.category is cat)
CLASS_CATEGORY: dict[str, str] = {row.cls.value: row.category.value for row in TABLE}

#: Names older versions wrote to event logs and verdicts, and the class each now means.
#: (disk_error and worker_crash folded several Table 1 classes; the closest one is kept.)
LEGACY: dict[str, FailureClass] = {
    "nccl_error": F.NETWORK, "network_error": F.NETWORK, "oom": F.GPU_OOM,
    "disk_error": F.DISK_FAULT, "worker_crash": F.WORKER_SIGNAL,
    "user_code": F.USER_EXCEPTION, "hang": F.JOB_HANG, "fail_slow": F.MFU_DECLINE,
    "code_change": F.CODE_DATA_CHANGE,
}


def canonical(name: str) -> FailureClass | None:
    """The class a recorded name means (current or legacy), or None when unknown."""
    try:
        return FailureClass(name)
    except ValueError:
        return LEGACY.get(name)


def row(name: str) -> TaxonomyRow:
    """The table row of a class name (current or legacy). Raises KeyError if unknown."""
    cls = canonical(name)
    if cls is None:
        raise KeyError(f"unknown failure class {name!r}; valid: {', '.join(CLASSES)}")
    return ROWS[cls]


def side_of(name: str) -> Side:
    """The class's default side; unknown names are Side.UNKNOWN."""
    cls = canonical(name)
    return ROWS[cls].side if cls is not None else Side.UNKNOWN


def evicts(name: str) -> bool:
    """Whether the class's default action names the node as the culprit at once."""
    cls = canonical(name)
    return cls is not None and ROWS[cls].action is Action.EVICT


def node_side(name: str, side: str | None = None) -> bool:
    """Whether a failure of class ``name`` is evidence against the node it happened on:
    infrastructure side (``side``, the classifier's call for this failure, else the
    class's default) and a fault that lives on the node (:class:`Locus`). The one rule
    for count-based blame: repeats of anything else (user code, an unknown cause, shared
    storage, a web service) never evict a node by count alone; stop-time diagnosis on
    the node decides (launcher/control/stop_diagnosis.py)."""
    cls = canonical(name)
    if cls is None:
        return False
    try:
        decided = Side(side) if side is not None else ROWS[cls].side
    except ValueError:
        decided = Side.UNKNOWN
    return decided is Side.INFRASTRUCTURE and ROWS[cls].locus is Locus.NODE


def blame_cause(name: str, side: str | None = None) -> str:
    """How a verdict names the cause of a failure that repeated after its node passed
    stop-time diagnosis: external (an off-node class) or unknown, never plainly "user
    code": a passed check rules the node out, it does not prove the code wrong."""
    cls = canonical(name)
    try:
        decided = Side(side) if side is not None else side_of(name)
    except ValueError:
        decided = Side.UNKNOWN
    if cls is not None and ROWS[cls].locus is Locus.OFF_NODE:
        return f"an external cause ({cls.value}: a service outside the node)"
    if decided is Side.USER:
        return "an unknown cause, most likely the job's own code, data or settings"
    return "an unknown cause (the evidence names neither the node nor the code)"


def stops_on_repeat(name: str) -> bool:
    """Whether the same signature after a clean restart means user code (stop)."""
    cls = canonical(name)
    return cls is not None and ROWS[cls].action is Action.STOP_ON_REPEAT


#: The Table 1 classes, in the paper's order (the report lists each by its own name).
TABLE1_CLASSES: tuple[FailureClass, ...] = tuple(r.cls for r in TABLE if r.table1 is not None)
