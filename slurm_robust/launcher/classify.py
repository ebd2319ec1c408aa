"""Classify a failed worker from all the evidence there is (pure).

Evidence, strongest first: the exit sentinels of the training API (NaN, loss spike); the
GPU's own state read through NVML (uncorrectable ECC, hardware Xids, GPUs missing); the
node's kernel log (Xid lines, panics, disk I/O errors, the OOM killer); the worker's exit
code or signal (from the trusted SPANK task-exit record when there is one); the tail of
the worker's log. The classes, sides and default actions are slurm_robust.taxonomy's.

Log patterns are wording *families* (NCCL/verbs transport errors, the CUDA error names
across runtime versions, the legacy "cuda runtime error (N)" numbers, both Xid wordings).
Each rule carries the :class:`Strength` of what it matches (hardware report > kernel
record > library error > generic wording); the strongest matching rule wins, and among
equals the rule order: a specific cause (ECC, a memlock limit, a full disk) before its
consequences (a CUDA error, a collective timeout, a traceback, a signal). The kernel rules
take only kernel-originated lines (a Python traceback that says "Call Trace" is not a
panic; a hung-task report is a hang to diagnose). The answer names its rule, line and
strength (``evidence["classifier"]``), which the incident record keeps. Where the
evidence could be either side (an illegal memory access may be user code or the GPU) the
side is "unknown", whose action is diagnosis, never eviction.

A worker whose peer died sees a broken connection ("Connection closed by peer" from
gloo, NCCL "remote process exited"); that is a *secondary* failure: the controller waits
a little for the primary one (the killed worker, the lost node) before deciding.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from slurm_robust.health.errors import NoNVMLError
from slurm_robust.health.kernel_formats import KernelEventKind, parse_text
from slurm_robust.launcher.classify_model import Model, default_model, features
from slurm_robust.launcher.wire_records import (
    ClassifierEvidence,
    ExitEvidence,
    NvmlReadings,
)
from slurm_robust.taxonomy import (
    ROWS,
    TABLE,
    Action,
    FailureClass,
    Side,
)

F = FailureClass

#: Exit code the training API uses when a step's loss or grad norm is not finite.
EXIT_NONFINITE = 87
#: Exit code the training API uses for a loss or grad-norm spike.
EXIT_SPIKE = 88

#: Class name -> category, for callers that predate the taxonomy module.
CATEGORY: dict[str, str] = {row.cls.value: row.category.value for row in TABLE}

#: Classes that name the node as the culprit at once (evict it, do not retry on it).
NODE_CLASSES = frozenset(row.cls.value for row in TABLE if row.action is Action.EVICT
                         and row.category.value == "explicit")

# NVIDIA's Xid catalogue. Hardware: the GPU or its memory cannot be trusted.
XID_MEMORY = frozenset({48, 63, 64, 92, 94, 95})
XID_UNAVAILABLE = frozenset({61, 62, 74, 79, 119, 120})
#: Usually caused by the application (bad address, a kernel the driver had to stop).
XID_APPLICATION = frozenset({13, 31, 43, 45})

_USER_EXC = ("TypeError", "IndexError", "KeyError", "AttributeError", "NameError",
             "ValueError", "ZeroDivisionError", "AssertionError", "ImportError",
             "ModuleNotFoundError", "SyntaxError", "NotImplementedError", "UnboundLocalError",
             "RecursionError", "StopIteration")


class Strength(IntEnum):
    """How much a matched line proves, weakest first. When several rules match one log,
    the strongest wins; among equals, the earlier rule (causes before consequences)."""

    GENERIC = 1   # wording any program may print: a broken pipe, "Killed", a timeout
    LIBRARY = 2   # a library's or runtime's own error: CUDA, NCCL, an errno, an exception
    KERNEL = 3    # a record the kernel (or the scheduler) writes: a panic, a block I/O error
    HARDWARE = 4  # the hardware's own report: ECC, a GPU off the bus, a hardware Xid

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Rule:
    name: str
    cls: FailureClass
    pattern: re.Pattern[str]
    side: Side | None = None  # None: the class's default side
    secondary: bool = False
    strength: Strength = Strength.LIBRARY
    # A line the pattern matched counts only if this accepts it (None: every line).
    accept: Callable[[str, str], bool] | None = None


def _rx(text: str, flags: int = re.I) -> re.Pattern[str]:
    return re.compile(text, flags)


# A kernel message in a log tail: a dmesg or kmsg prefix ("[ 1234.567890]", "<4>[...]",
# "Dec  2 19:33:42 host kernel: "). A Python traceback that quotes "Call Trace" or names a
# function "+0x1f/0x40" has none of these.
_KERNEL_PREFIX = re.compile(
    r"^\s*(?:<\d{1,3}>)?(?:\[\s*\d+\.\d+\]|"
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT[\d:.]+\S*) \S+ kernel: )")
# The kernel's hung-task report: a task blocked in D state (a slow disk or file server);
# its call trace follows it. Worth diagnosing, never a panic (unless the kernel says
# "Kernel panic - not syncing: hung_task", which the panic rule reads).
_HUNG_TASK = re.compile(r"INFO: task \S.{0,30}:\d+ blocked for more than \d+ seconds")
# The task line of the kernel's dump of a task in uninterruptible sleep (sched_show_task:
# "task:python3 state:D stack:0 pid:..."), as a hung-task report or `echo w >
# /proc/sysrq-trigger` prints it, with or without the "INFO: task ... blocked" header
# (a dmesg -H copy, a partial paste). A process stuck in the kernel: a hang to diagnose.
_D_STATE_TASK = re.compile(r"\btask:\S+\s+state:D\s+stack:", re.I)


def _kernel_panic_line(line: str, log: str) -> bool:
    """A panic, oops or machine check as the kernel prints it (health.kernel_formats'
    anchored formats), not a sentence that mentions one."""
    event = parse_text(line)
    return event is not None and event.kind is KernelEventKind.PANIC


def _kernel_trace_line(line: str, log: str) -> bool:
    """A kernel stack-trace line (kernel-prefixed), and no hung-task report in the log
    that the trace would belong to."""
    return _KERNEL_PREFIX.match(line) is not None and _HUNG_TASK.search(log) is None \
        and _D_STATE_TASK.search(log) is None


def _hung_task_line(line: str, log: str) -> bool:
    event = parse_text(line)
    return event is not None and event.kind is KernelEventKind.HUNG_TASK


# The kernel's CPU-stall reports, as it words them (after any dmesg prefix).
_CPU_STALL = re.compile(r"(?:NMI )?watchdog: BUG: soft lockup - CPU#\d+ stuck for|"
                        r"(?:rcu: )?(?:INFO: )?rcu_\w+ (?:self-)?detected stalls? on CPU")


# DeepSpeed's "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: ..." and apex's
# "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to ...".
_OVERFLOW_STEP = re.compile(r"OVERFLOW! Rank \d+ Skipping step|Gradient overflow\. +Skipping "
                            r"step|overflow detected, setting loss scale to", re.I)
#: Overflow skips in one log tail that make a divergence rather than routine scaling.
OVERFLOW_RUN = 5
_SCALE_TO = re.compile(r"loss scale to:? (?P<scale>[0-9.]+(e[-+]?\d+)?)", re.I)
#: A loss scale below this has collapsed: the scaler started at 2**7..2**16 and has
#: halved at least 17 times; healthy fp16 runs keep it well above 1.
COLLAPSED_SCALE = 1e-3
# A loss scale a trainer reports ("loss_scale : 8192.0" in DLLogger's PARAMETER lines,
# fairseq's "loss_scale=0.062", Megatron's "loss scale: 1.0"); every value in the tail.
_SCALE_VALUE = re.compile(r"\bloss[_ ]scale\b\s*[:=]?\s*(?P<scale>[0-9]+(\.[0-9]*)?(e[-+]?\d+)?)",
                          re.I)
#: Reported scales, each lower than the one before, that make a collapse in progress
#: (a dynamic scaler halves on an overflow and grows back after a quiet stretch).
FALLING_SCALES = 6


def _overflow_run(line: str, log: str) -> bool:
    """A run of overflow skips, a loss scale driven below any useful value (a dynamic
    scaler starts at 2**16 and a healthy one stays well above 1), or the reported scale
    falling step after step without ever growing back."""
    if len(_OVERFLOW_STEP.findall(log)) >= OVERFLOW_RUN:
        return True
    scale = _SCALE_TO.search(line) or _SCALE_VALUE.search(line)
    try:
        if scale is not None and float(scale["scale"]) < COLLAPSED_SCALE:
            return True
        values = [float(m["scale"]) for m in _SCALE_VALUE.finditer(log)]
    except ValueError:
        return False
    falling = 1
    for before, after in zip(values, values[1:], strict=False):
        falling = falling + 1 if after < before else 1
        if falling >= FALLING_SCALES:
            return True
    return False


def _cpu_stall_line(line: str, log: str) -> bool:
    text = _KERNEL_PREFIX.sub("", line, count=1).strip()
    return _CPU_STALL.match(text) is not None


_G, _L, _K, _H = Strength.GENERIC, Strength.LIBRARY, Strength.KERNEL, Strength.HARDWARE

#: NCCL's INFO lines name its transports (NET/IB, NET/Socket, NET/OFI) on every healthy
#: run: they report a choice, never a failure.
_NCCL_INFO = re.compile(r"\bNCCL INFO\b")
#: A process using shared memory, as its log shows it.
_SHM_USE = re.compile(r"shared_memory|/dev/shm|\bshm\b", re.I)
#: The CUDA runtime initialising (PyTorch's lazy init, the driver API's cuInit, the first
#: device count).
_CUDA_INIT = re.compile(r"_cuda_init\b|\bcuInit\b|cudaGetDeviceCount|CUDA initialization")
#: Azure Storage in a log: its client library's modules (as a traceback's paths or as
#: module names) or one of its endpoints; azure.core's exceptions serve every Azure SDK.
_AZURE_STORAGE = re.compile(
    r"azure[/.\\]storage[/.\\]|\.(blob|dfs|file|queue)\.core\.windows\.net\b", re.I)
#: A path on a remote or shared file system as remote_io reads it: an object store's URL,
#: Colab's Drive mount, a Lustre/GPFS tree, an NFS or pNFS mount.
_SHARED_PATH = r"(s3://|gs://|hdfs://|/content/drive|/lustre|/gpfs|/p?nfs)"
#: An object-store URL's scheme (S3, GCS, Azure, OCI), as object_store_url matches it.
_OBJECT_URL = r"\b(s3|s3a|gs|gcs|az|abfss?|oci)://"

# Log rules in priority order: causes before consequences. Each carries the strength of
# what it matches; the strongest match wins (classify), the order breaks ties.
LOG_RULES: tuple[Rule, ...] = (
    Rule("ecc", F.GPU_MEMORY_ERROR, _rx(
        r"uncorrectable ECC|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable|double[- ]bit ECC|"
        r"row[- ]remap\w* fail|cuda runtime error \(39\)"), strength=_H),
    Rule("gpu_gone", F.GPU_UNAVAILABLE, _rx(
        r"fallen off the bus|GPU is lost|NVML_ERROR_GPU_IS_LOST|"
        r"Failed to initialize NVML(?!: Unknown Error)|"
        r"Driver/library version mismatch|Unable to determine the device handle|"
        # the kernel module's side of the same mismatch (a driver updated, not reloaded)
        r"NVRM: API mismatch|this kernel module has the version|"
        r"RmInitAdapter failed|probe routine failed|GPU requires reset"), strength=_H),
    # nvidia-smi printing ERR! for the readings of a GPU it can no longer read (its
    # table's fields: fan, temperature, power, utilisation): a GPU in a bad state. The
    # tool's reading, not the hardware's own report: diagnosis confirms it.
    Rule("nvidia_smi_err", F.GPU_UNAVAILABLE, _rx(r"\|\s*\d+\s+ERR!|ERR!\s+ERR!"),
         side=Side.UNKNOWN, strength=_L),
    # NVML's "Unknown Error" inside a container that could use its GPUs before: the
    # container's device cgroup was rewritten under it (systemd reloading units, NVIDIA's
    # container-toolkit notice); the host still sees the GPU. Recreate the container.
    Rule("nvml_unknown_error", F.CONTAINER_RUNTIME, _rx(
        r"Failed to initialize NVML: Unknown Error"), strength=_L),
    # PyTorch's check of the installed build against the node's driver, and the CUDA
    # runtime's own word for the same (cudaErrorInsufficientDriver, error 35, as caffe's
    # and TensorFlow's checks print it): the job's CUDA build is newer than the driver, or
    # the driver older than the image needs. A version mismatch either side could
    # resolve (a newer driver on the node, an older build in the job), not a broken driver.
    Rule("driver_too_old", F.BAD_CONFIG, _rx(
        r"NVIDIA driver on your system is too old|"
        r"CUDA driver version is insufficient for CUDA runtime|cudaErrorInsufficientDriver|"
        r"CUDA_ERROR_INSUFFICIENT_DRIVER|cuda runtime error \((35|34|222|803)\)|"
        # the CUDA runtime's other words for a build and a driver that do not fit each
        # other (cudaGetErrorString of errors 34, 222, 803): a stub libcuda instead of the
        # driver's, PTX newer than the driver can compile, a user-space driver that does
        # not match the kernel module
        r"CUDA driver is a stub library|cudaErrorStubLibrary|"
        r"PTX was compiled with an unsupported toolchain|cudaErrorUnsupportedPtxVersion|"
        r"CUDA_ERROR_UNSUPPORTED_PTX_VERSION|"
        r"system has unsupported display driver / cuda driver combination|"
        r"cudaErrorSystemDriverMismatch|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"),
        side=Side.UNKNOWN, strength=_L),
    # Forward compatibility refused (error 804): the CUDA compatibility libraries the
    # image ships, or the container runtime's hook injects, loaded on a GPU or driver
    # that cannot use them. What the container brings, not the node's GPU.
    Rule("cuda_compat_refused", F.CONTAINER_RUNTIME, _rx(
        r"forward compatibility was attempted on non supported HW|"
        r"cudaErrorCompatNotSupportedOnDevice|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE|"
        r"cuda runtime error \(804\)"), side=Side.UNKNOWN, strength=_L),
    # What user space prints when it cannot reach the driver: a broken driver, but also a
    # job whose cgroup holds no GPU (it asked Slurm for none). No hardware evidence by
    # itself: the node's own GPU checks decide (diagnosis).
    Rule("gpu_driver_unreachable", F.GPU_UNAVAILABLE, _rx(
        r"unable to communicate with the NVIDIA driver|nvidia-smi has failed|"
        # TensorFlow's CUDA diagnostics finding no driver loaded on the host
        r"kernel driver does not appear to be running on this host|"
        r"/proc/driver/nvidia/version does not exist"),
        side=Side.UNKNOWN, strength=_L),
    # The CUDA runtime refusing all work because the node is not ready for it
    # (cudaErrorSystemNotReady, error 802: on NVSwitch machines the fabric manager is not
    # running or does not match the driver). No GPU on the node can run CUDA, whatever
    # the job; the library's word, not a hardware report: diagnosis confirms it.
    Rule("cuda_system_not_ready", F.GPU_UNAVAILABLE, _rx(
        r"system not yet initialized|cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY"),
        side=Side.UNKNOWN, strength=_L),
    # The CUDA runtime relaying an uncorrectable NVLink error (cudaErrorNvlinkUncorrectable,
    # CUDA_ERROR_NVLINK_UNCORRECTABLE): the link's own hardware report, stronger than the
    # socket or mount errors the dying ranks print next to it. Whether the link, the GPU
    # or the board is at fault the line does not say: diagnosis, not eviction.
    Rule("nvlink_uncorrectable", F.CUDA_ERROR, _rx(
        r"uncorrectable NVLink error|NVLINK_UNCORRECTABLE|cudaErrorNvlinkUncorrectable"),
        side=Side.UNKNOWN, strength=_H),
    # CUDA's catch-all error (cudaErrorUnknown, 30 in the old numbering, 999 now) raised
    # while the runtime initialises: the driver cannot bring the GPU up (a wedged GPU
    # that a reboot or reset clears, a missing uvm module). Later in a run the same
    # words are any kernel's failure and stay a CUDA error.
    Rule("cuda_init_failed", F.GPU_UNAVAILABLE, _rx(
        r"cuda runtime error \((30|999)\)|CUDA_ERROR_UNKNOWN|cudaErrorUnknown|"
        r"CUDA error: unknown error|Error (30|999): unknown error"),
        side=Side.UNKNOWN, strength=_L,
        accept=lambda line, log: _CUDA_INIT.search(log) is not None),
    Rule("kernel_panic", F.KERNEL_PANIC, _rx(
        r"Kernel panic|kernel BUG at|\bOops\b: |hard LOCKUP|"
        r"mce: \[Hardware Error\]|Machine check events logged"), strength=_K,
        accept=_kernel_panic_line),
    Rule("cpu_stall", F.CPU_OVERLOAD, _rx(
        r"soft lockup|rcu_sched self-detected stall|detected stalls on CPUs"), strength=_K,
        accept=_cpu_stall_line),
    Rule("node_fail", F.NODE_LOST, _rx(
        r"Node failure on|\bNODE_FAIL\b|DUE TO NODE FAILURE|node_fail\b|\bNot responding\b|"
        r"Kill task failed|marked dead|missed too many heartbeats|"
        r"Node unexpectedly rebooted|"
        # the kubelet ending pods because its node is shutting down (a preemptible or
        # spot VM reclaimed, a maintenance drain)
        r"terminated (due to|in response to) imminent node shutdown"), strength=_K),
    # Slurm unable to start a task on a node for a reason of that node (its credential
    # expired: the node's clock or its slurmd; its connection failed): the node, not the
    # job's request. Side unknown: the node's own checks decide.
    Rule("slurm_task_launch", F.NODE_LOST, _rx(
        r"Task launch for \S+ failed on node \S+: (Job credential expired|Communication "
        r"connection failure|Socket timed out|Invalid job credential|Unspecified error)"),
        side=Side.UNKNOWN, strength=_K),
    # Ray's own word that a worker's node is gone (the GCS saw its raylet die), and a
    # worker that can no longer reach its node's raylet: the node, or its raylet killed
    # (by the OOM killer, say), hence side unknown.
    Rule("ray_node_died", F.NODE_LOST, _rx(
        r"because its node has died|\bNodeDiedError\b|"
        r"Could not connect to socket \S*/sockets/raylet"), side=Side.UNKNOWN),
    # Other batch schedulers' own records of a job run past its time limit (PBS/Torque,
    # Moab, LSF's TERM_RUNLIMIT), as slurm_time_limit reads Slurm's: the job's request.
    Rule("batch_time_limit", F.BAD_CONFIG, _rx(
        r"PBS: job killed: walltime \d+ exceeded limit|Job exceeded its walltime limit|"
        r"job exceeded wallclock limit|TERM_RUNLIMIT: job killed"), side=Side.USER,
        strength=_K),
    # slurmstepd's own line when the job ran past its time limit (src/slurmd/slurmstepd/
    # req.c): the limit asked for was too short, not a fault of any node. Under the
    # launcher the limit is met by its warning signal first; this is the job that had none.
    Rule("slurm_time_limit", F.BAD_CONFIG, _rx(
        r"\bCANCELLED AT \S+ DUE TO TIME LIMIT\b"), side=Side.USER, strength=_K),
    # sbatch/srun refusing the request itself (src/common/slurm_errno.c): more memory,
    # GRES, nodes or time than the cluster's configuration can ever give, or an invalid
    # account/partition. The job's request, decided before any node ran it.
    Rule("slurm_request_refused", F.BAD_CONFIG, _rx(
        r"Memory specification can not be satisfied|Requested node configuration is not "
        r"available|Invalid generic resource \(gres\) specification|Requested time limit is "
        r"invalid|Node count specification invalid|Invalid account or account/partition "
        r"combination specified|Invalid partition name specified|Invalid qos "
        r"specification|Job violates accounting/QOS policy|Invalid feature specification|"
        r"More processors requested than permitted|Memory required by task is not "
        r"available|Invalid Trackable RESource \(TRES\) specification"),
        side=Side.USER, strength=_K),
    Rule("block_io", F.DISK_FAULT, _rx(
        r"blk_update_request: .*error|Buffer I/O error|I/O error, dev |failed command: "
        r"(READ|WRITE)|EXT4-fs error|XFS \(\S+\): .*(I/O error|Corruption)|"
        r"Remounting filesystem read-only|critical medium error|Medium Error|"
        r"nvme\d+\S*: .*(timeout|I/O)|ata\d+(\.\d+)?: (exception|failed|error)|"
        # smartctl's verdicts on a failing drive
        r"SMART overall-health self-assessment test result: FAILED|"
        r"Currently unreadable \(pending\) sectors|FAILING_NOW"), strength=_K),
    # EUCLEAN ("Structure needs cleaning", errno 117): the file system's own metadata
    # checks found it corrupt (XFS, ext4). What the job sees of the same fault the
    # kernel's block_io lines report, but from user space it does not say which file
    # system (a node's disk or a shared one): the node's disk checks decide.
    Rule("fs_corrupt", F.DISK_FAULT, _rx(r"Structure needs cleaning|Errno 117\b|\bEUCLEAN\b"),
         side=Side.UNKNOWN),
    Rule("hung_task", F.JOB_HANG, _HUNG_TASK, side=Side.UNKNOWN, strength=_K,
         accept=_hung_task_line),
    Rule("d_state_task", F.JOB_HANG, _D_STATE_TASK, side=Side.UNKNOWN, strength=_K),
    # The kubelet evicting pods because the node ran short (its eviction message and the
    # node conditions it names): the node's disk or memory, which the pod's own use may
    # have filled or not; the message does not say whose.
    Rule("node_pressure_disk", F.DISK_FULL, _rx(
        r"The node was low on resource: ephemeral-storage|"
        r"The node had condition: \[DiskPressure\]"), side=Side.UNKNOWN, strength=_K),
    # The kubelet evicting a pod that wrote more to its node-local scratch than the
    # pod's own ephemeral-storage limit: the job's files against the job's request.
    Rule("pod_storage_limit", F.DISK_FULL, _rx(
        r"ephemeral local storage usage exceeds the total limit|"
        r"Container \S+ exceeded its local ephemeral storage limit"), side=Side.USER,
        strength=_K),
    Rule("node_pressure_memory", F.CPU_OOM, _rx(
        r"The node was low on resource: memory|The node had condition: \[MemoryPressure\]"),
        side=Side.UNKNOWN, strength=_K),
    # The HCA's own asynchronous events as NCCL and the verbs library relay them
    # (ibv_get_async_event: a port going down, a local catastrophic error of the adapter,
    # a fatal device event): the link or the adapter, not the job's settings, and
    # stronger than the library calls failing after it.
    Rule("ib_async_event", F.NETWORK, _rx(
        r"Got async event\s*:\s*(local catastrophic error|port error|device fatal|"
        r"port down|link down|GID table change|local work queue catastrophic|"
        r"QP fatal|CQ error|SRQ catastrophic)|IBV_EVENT_(DEVICE_FATAL|PORT_ERR|"
        r"QP_FATAL|CQ_ERR)"), strength=_K),
    # "device-side assert triggered", not PyTorch's generic hint under every CUDA error
    # ("Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions").
    Rule("device_assert", F.USER_CUDA_FAULT, _rx(
        r"device-side assert(?!ions)|cudaErrorAssert|CUDA_ERROR_ASSERT|cuda runtime error \(59\)|"
        r"\.cuh?:\d+:.*Assertion .* failed|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\].*"
        r"Assertion|misaligned address|invalid configuration argument|"
        r"too many resources requested for launch")),
    # Java's and Ray's OutOfMemoryError are host memory (oom_killer reads them), and so is
    # TensorFlow's OOM on a CPU device.
    Rule("gpu_oom", F.GPU_OOM, _rx(
        r"CUDA out of memory|(?<!java\.lang\.)(?<!ray\.exceptions\.)OutOfMemoryError"
        r"(?!: Java heap)|CUBLAS_STATUS_ALLOC_FAILED|"
        r"CUDNN_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
        r"RESOURCE_EXHAUSTED: OOM|OOM when allocating(?![^\n]*device:CPU)|"
        r"cuda runtime error \(2\)|CUDA error: out of memory|HIP out of memory|"
        r"Failed to CUDA calloc|"
        # PyTorch's caching allocator ("Tried to allocate 20.00 MiB (GPU 0; ...)"), NCCL's
        # failed cudaMalloc, XLA's allocator (JAX), Apple's MPS backend
        r"Tried to allocate [\d.]+ [KMGT]iB|Cuda failure (\d+ )?'?out of memory|"
        r"cudaMalloc\w*[^\n]*out of memory|RESOURCE_EXHAUSTED: Out of memory|"
        r"MPS backend out of memory|"
        # XLA's other words for device memory (JAX, TensorFlow and torch_xla on GPUs and
        # TPUs): the compiler's HBM budget, the runtime's device buffers and its BFC
        # allocator. RESOURCE_EXHAUSTED alone is also gRPC's quota status, so the memory
        # words themselves are required.
        r"Ran out of memory in memory space hbm|Exceeded hbm capacity|"
        r"Error allocating device buffer|Failed to allocate request for [\d.]+ ?[KMGT]i?B|"
        r"Attempting to (allocate|reserve) [\d.]+ ?[KMGT]i?B\.? That was not possible|"
        # XLA's executor before the RESOURCE_EXHAUSTED status name ("Resource exhausted:
        # Out of memory while trying to allocate N bytes", often wrapped mid-phrase)
        r"of memory while trying to allocate \d+ bytes")),
    # cuBLAS unable to create its handle (CUBLAS_STATUS_NOT_INITIALIZED from cublasCreate):
    # its workspace could not be allocated, most often a GPU already full; an embedding
    # index out of range or a broken CUDA setup print the same, hence side unknown.
    Rule("cublas_handle", F.GPU_OOM, _rx(
        r"CUBLAS_STATUS_NOT_INITIALIZED[^\n]*cublasCreate|failed to create cublas handle"),
        side=Side.UNKNOWN),
    # A kernel killed by the display watchdog or the operating system's limit on one kernel
    # (cudaErrorLaunchTimeout): the GPU drives a display or runs under WDDM, a setting of
    # the machine the job was given, not a fault of the GPU or of the code.
    Rule("launch_timeout", F.BAD_CONFIG, _rx(
        r"the launch timed out and was terminated|CUDA_ERROR_LAUNCH_TIMEOUT|"
        r"cudaErrorLaunchTimeout"), side=Side.UNKNOWN),
    Rule("memlock", F.BAD_CONFIG, _rx(
        r"ulimit -l|max locked memory|RLIMIT_MEMLOCK|memlock|"
        r"ibv_\w+\S*\)? failed[^\n]*(Cannot allocate memory|errno 12|ENOMEM)|"
        r"Call to ibv_\w+ failed")),
    Rule("gpu_build", F.BAD_CONFIG, _rx(
        r"invalid device ordinal|cudaErrorInvalidDevice\b|no kernel image is available|"
        r"cudaErrorNoKernelImageForDevice|invalid device function|"
        r"cuda runtime error \((8|10|48)\)")),
    # The job's software build does not fit the node or itself: a CPU-only or NCCL-less
    # PyTorch, an extension compiled for another CUDA, a GPU architecture the build or a
    # kernel library does not support, a C library newer than the node's. The job's
    # environment (PyTorch's, nvcc's, flash-attn's, Triton's and glibc's own wording).
    Rule("build_mismatch", F.BAD_CONFIG, _rx(
        r"Torch not compiled with CUDA enabled|doesn't have NCCL built in|"
        r"The detected CUDA version \([\d.]+\) mismatches the version that was used to "
        r"compile|CUDA_HOME environment variable is not set|"
        r"Unsupported gpu architecture|is not compatible with the current PyTorch "
        r"installation|only supports Ampere GPUs or newer|Bfloat16 is only supported on|"
        r"version [`'\u2018\u2019\"]?GLIBC\w*_[\d.]+[`'\u2018\u2019\"]? not found|"
        # XLA's NCCL collectives with no NCCL library in the job's environment
        r"Unable to load NCCL library|"
        r"PyTorch and torchvision were compiled with different CUDA versions|"
        # Apex installed without its compiled extensions (pip's Python-only build)
        r"No module named '(amp_C|fused_layer_norm_cuda|fused_adam_cuda|apex_C|syncbn)'|"
        r"APEX and CUDA required for"), side=Side.USER),
    # A shared library the job's environment cannot find (libcudart, libcudnn...). The
    # driver's own libraries (libcuda, libnvidia-ml) missing in a container are the
    # runtime's GPU hook, so they are left to the container rules; NCCL's optional
    # plugins (libnccl-net.so, its tuner) are reported missing at INFO level on every
    # healthy run.
    Rule("shared_lib_missing", F.BAD_CONFIG, _rx(
        r"\blib(?!cuda\.so|nvidia|nccl)[\w+.-]*\.so[.\d]*: cannot open shared object file"),
        side=Side.UNKNOWN, accept=lambda line, log: " INFO " not in line),
    # nvidia-smi finding no GPU at all ("No devices were found"): the driver is loaded
    # but enumerates none, a GPU off the bus or a node whose GPUs were never brought up,
    # which a job's own settings cannot cause (CUDA_VISIBLE_DEVICES does not reach
    # nvidia-smi). The tool's reading: diagnosis confirms it.
    Rule("nvidia_smi_no_devices", F.GPU_UNAVAILABLE, _rx(r"\bNo devices were found\b"),
         side=Side.UNKNOWN),
    # No GPU visible to the process: usually CUDA_VISIBLE_DEVICES or the request, but a
    # lost GPU looks the same from inside; diagnosis (NVML's count) tells them apart.
    Rule("no_gpu", F.BAD_CONFIG, _rx(
        r"No CUDA GPUs are available|no CUDA-capable device is detected|cudaErrorNoDevice|"
        r"CUDA_ERROR_NO_DEVICE|cuda runtime error \((38|100)\)|"
        # Lightning's device check finding none at all (its list of visible GPUs empty)
        r"But your machine only has: \[\]"), side=Side.UNKNOWN),
    # Lightning's refusal of the Trainer's own settings (MisconfigurationException), most
    # often more devices than the allocation gives ("You requested gpu: [0, 1] But your
    # machine only has: [0]"): the job's configuration against a node that works. With no
    # GPU visible at all the rule above decides, since a lost GPU looks the same.
    Rule("framework_misconfig", F.BAD_CONFIG, _rx(
        r"MisconfigurationException|You requested gpus?: \[[\d, ]+\]\s*But your machine "
        r"only has"), side=Side.USER),
    # A port already taken: the job's own choice of port, or a stale process on the node.
    Rule("port", F.BAD_CONFIG, _rx(
        r"Address already in use|EADDRINUSE|Errno 98\b|failed to bind|\bbind failed\b|"
        # EADDRNOTAVAIL: binding an address this node does not have (MASTER_ADDR or an
        # interface set for another host)
        r"Cannot assign requested address|EADDRNOTAVAIL|Errno 99\b|"
        r"server socket has failed to listen"), side=Side.UNKNOWN),
    # EMFILE: the process's open-file limit (DataLoader workers passing tensors as file
    # descriptors, PyTorch's own message names `ulimit -n`); the limit or a leak in the
    # job, not the node.
    Rule("fd_limit", F.BAD_CONFIG, _rx(
        r"Too many open files|Errno 24\b|\bEMFILE\b|received 0 items of ancdata"),
        side=Side.UNKNOWN),
    Rule("shm", F.CONTAINER_RUNTIME, _rx(
        r"insufficient shared memory|out of shared memory|shared memory \(shm\)|"
        r"shared memory limit|/dev/shm|--shm-size|shm size|unable to write to file </torch_|"
        r"unable to (open|mmap) shared memory|\bSemLock\b|sem_open|"
        r"joblib will operate in serial mode|creating shared memory segment|"
        # a DataLoader worker's bus error is its shared-memory segment running out: the
        # tensors it hands back live in /dev/shm (PyTorch's own hint says so)
        r"DataLoader worker \(pid \S+\) is killed by signal: Bus error|"
        r"Unexpected bus error encountered in worker|"
        r"shm\.h:\d+[^\n]*posix_fallocate")),
    # A bus error in a process that uses shared memory (multiprocessing's resource
    # tracker, /dev/shm, a DataLoader): touching a shared-memory page the full tmpfs
    # could not back, the container's shm size rather than the code.
    Rule("bus_error_shm", F.CONTAINER_RUNTIME, _rx(r"\bBus error\b|\bSIGBUS\b"),
         accept=lambda line, log: _SHM_USE.search(log) is not None),
    # A registry's pull rate limit (Docker Hub's "toomanyrequests"): the registry, an
    # external service, refusing more pulls from this address or account for a while
    # (as service_down reads an HTTP 429; off-node, so never an eviction).
    Rule("registry_rate_limit", F.EXTERNAL_SERVICE, _rx(
        r"\btoomanyrequests\b|You have reached your pull rate limit")),
    # A registry refusing the job's image (credentials, a wrong name): the job's setting.
    Rule("container_auth", F.BAD_CONFIG, _rx(
        r"returned error code: 40[13]|401 Unauthorized|403 Forbidden|manifest unknown|"
        r"pull access denied|repository does not exist|requested access to the resource is "
        r"denied")),
    # pyxis takes an image argument that is not a path starting with / or ./ for a
    # registry image: a squashfs file named bare ("image.sqsh") is then "imported" from
    # a registry and fails. The job's setting (pyxis README, --container-image).
    Rule("pyxis_bare_sqsh", F.BAD_CONFIG, _rx(
        r"pyxis: importing docker image: (?![/.])\S+\.(sqsh|squashfs)\b")),
    # enroot refusing one of the job's --container-mounts (a missing or unreadable
    # source, a path pyxis splits at a space): the mount the job asked for. The source
    # may also be a shared file system missing on the node: unknown side.
    Rule("container_mount_spec", F.BAD_CONFIG, _rx(r"enroot-mount: failed to mount"),
         side=Side.UNKNOWN),
    # A container that does not start: the runtime, or the job's image reference.
    Rule("container_start", F.CONTAINER_RUNTIME, _rx(
        r"OCI runtime|nvidia-container-cli|container_linux\.go|"
        r"docker: Error response from daemon|\benroot\b|\bpyxis\b|"
        r"FATAL: +container creation failed|could not select device driver \"?nvidia|"
        # Apptainer/Singularity unpacking the image before it can start it (a SIF
        # converted to a sandbox, an OCI image packed into a SIF): whatever stops the
        # unpacking (its temporary directory's space, a missing squashfuse) stops the
        # container, not the job's code
        r"FATAL: +while (extracting|preparing image|making image)|"
        r"root filesystem extraction failed"),
        side=Side.UNKNOWN),
    # Full: a node or shared volume (infrastructure), or the job's own cache filling a
    # small default location (user); the log rarely says which, host_disk_free does.
    Rule("disk_full", F.DISK_FULL, _rx(
        r"No space left on device|Errno 28\b|\bENOSPC\b|StorageFull|Disk quota exceeded|"
        # HTTP 507, a storage server out of space or inodes (MinIO, WebDAV)
        r"\b507 Insufficient Storage\b|"
        r"exceed(ed|ing) (its |the )?(\w+ )?(disk|jobfs|scratch|storage) quota|"
        r"Errno 122\b|PytorchStreamWriter failed writing|file write failed"),
        side=Side.UNKNOWN),
    # LMDB refuses remote file systems (its documentation: no NFS); a stale handle from an
    # LMDB environment is the job's choice of where to put it, not a lost mount.
    Rule("lmdb_remote", F.BAD_CONFIG, _rx(r"lmdb\.Error[^\n]*(Stale file handle|Errno 116\b)"),
         side=Side.USER),
    Rule("mount", F.FILESYSTEM_MOUNT, _rx(
        r"slurmstepd: error: execve\(\): \S*slurm_script: No such file|"
        r"Transport endpoint is not connected|Stale file handle|\bESTALE\b|Errno 116\b|"
        # ESHUTDOWN: a network file system's client evicted by its server (Lustre's
        # classic "Cannot send after transport endpoint shutdown")
        r"Cannot send after transport endpoint shutdown|Errno 108\b|\bESHUTDOWN\b|"
        r"Errno 107\b|fusermount|failed to mount|failure to mount|mount error|"
        r"Could not mount|mount\.(nfs4?|lustre|cifs|ceph|glusterfs|beegfs|fuse)\b[^\n]*"
        r"(fail|error|refused|timed out)|not a mount point|Host is down|"
        r"nfs:? server[^\n]*not\s+responding")),
    # An object store refusing the request itself (S3's and its clones' error codes for
    # credentials, permissions, a bucket's settings, a malformed request): the job's
    # credentials or its request, not the store's health.
    Rule("object_store_refused", F.REMOTE_STORAGE, _rx(
        r"\((AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|ExpiredToken|"
        r"InvalidToken|AccessControlListNotSupported|AllAccessDisabled|InvalidBucketName|"
        r"AuthorizationHeaderMalformed|NoSuchBucket)\) when calling the \w+ operation|"
        r"is not authorized to perform: s3:"), side=Side.USER),
    # EIO on a line that names a remote or shared file system's path, in either order
    # ("[Errno 5] Input/output error: '/lustre/...'", coreutils' "fsync failed for
    # '/mnt/pnfs/...': Input/output error"): that file system, not the node's disk.
    Rule("remote_io", F.REMOTE_STORAGE, _rx(
        r"(Input/output error|Errno 5\b)[^\n]*" + _SHARED_PATH + "|" + _SHARED_PATH +
        r"[^\n]*(Input/output error|Errno 5\b)|"
        r"botocore|boto3|\bS3Error|s3fs|NoSuchKey|SlowDown|\bHDFS\b|webhdfs|"
        r"LustreError|gcsfs|google\.cloud\.storage|azure\.storage|"
        r"/content/drive/|BlockMissingException|Could not obtain block|"
        # S3's 503 reply to a too-high request rate, as an HTTP client prints it
        r"503:? Slow Down|"
        # fsspec's remote-filesystem timeout (s3fs, gcsfs, http streaming)
        r"\bFSTimeoutError\b|"
        # Google's API clients (Go's googleapi, gcsfs, rclone, gcsfuse) on a GCS server
        # error ("googleapi: Error 503: Backend Error", "backendError"): the store's own
        # failure, retryable
        r"googleapi: (Error 5\d\d|got HTTP response code 5\d\d)|\bbackendError\b|"
        r"\bBackend Error\b|"
        # EREMOTEIO ("Remote I/O error", errno 121): a network file system's server failed
        # the request (NFS, Lustre, FUSE-backed stores)
        r"Remote I/O error|Errno 121\b|\bEREMOTEIO\b|"
        # azure-storage-blob's streaming download giving up after its retries
        r"Unable to stream download|Download stream interrupted")),
    # An object store's refusal (botocore's ClientError, the GCS JSON API's object URLs):
    # a 403 is the job's credentials, a 503 the store's load or the job's own write rate.
    # TensorFlow's own S3/GCS file systems log their failing requests and retries.
    Rule("object_store", F.REMOTE_STORAGE, _rx(
        r"when calling the \w+ operation|googleapis\.com/(upload/)?storage/|"
        r"tensorflow/core/platform/(s3|cloud)/\w+\.cc:\d+\]"),
        side=Side.UNKNOWN),
    # Azure Storage through its Python client (azure-storage-blob and its siblings, on
    # azure-core): the client's exception, or a failed request to a storage endpoint
    # (<account>.blob.core.windows.net). A refused account or key, the store's outage or
    # an unreachable endpoint read alike: side unknown.
    Rule("azure_storage", F.REMOTE_STORAGE, _rx(
        r"azure\.core\.exceptions\.\w+|\b[\w-]+\.(blob|dfs|file|queue)\.core\.windows\.net\b"),
        side=Side.UNKNOWN, accept=lambda line, log: _AZURE_STORAGE.search(log) is not None),
    # An error that names an object-store URL: a shard or checkpoint the job streams from
    # or to S3/GCS/Azure (aws s3 cp, gsutil cat, a streaming dataset's download) failed.
    # Which side (the store, the network, the path or its permissions) the line rarely says.
    Rule("object_store_url", F.REMOTE_STORAGE, _rx(
        r"(error|exception|failed|failure)[^\n]*" + _OBJECT_URL + "|" + _OBJECT_URL +
        r"[^\n]*(error|exception|failed|not found|broken pipe|timed out)"),
        side=Side.UNKNOWN),
    Rule("ib_io", F.NETWORK, _rx(r"(Input/output error|Errno 5\b)[^\n]*infiniband|"
                                 r"infiniband[^\n]*(Input/output error|Errno 5\b)")),
    # The AWS OFI NCCL plugin unable to set itself up: no libfabric provider or device
    # matches (fi_getinfo: a container without the EFA devices, a libfabric without the
    # provider) or its memory registration refused (a libfabric too old for the NCCL, a
    # locked-memory limit). The environment the job runs in, as memlock reads verbs'.
    Rule("ofi_setup", F.BAD_CONFIG, _rx(
        r"NET/OFI[^\n]*(fi_getinfo\(\)? call failed|Unable to register memory)"),
        side=Side.UNKNOWN),
    # A libfabric provider's own error report (EFA's RxR protocol, verbs, tcp...): its
    # "err: Input/output error (5) prov_errno: ..." is the fabric's completion failing,
    # not a disk; the source file it names is the provider's (prov/efa/src/...).
    Rule("ofi_provider", F.NETWORK, _rx(
        r"\bprov_errno\b|\bprov/(efa|verbs|rxm|rxd|tcp|udp|shm|psm\d?|cxi|opx|sockets)/\S+|"
        r"Unable to write to EQ|"
        # MPICH's OFI netmod failing a completion ("OFI poll failed (...:Input/output
        # error - UNDELIVERABLE)"): the fabric's EIO, not a disk's
        r"OFI poll failed|MPIDI_OFI_handle_cq_error"), side=Side.UNKNOWN),
    Rule("io_error", F.DISK_FAULT, _rx(r"Input/output error|Errno 5\b|\bEIO\b")),
    Rule("read_only", F.BAD_CONFIG, _rx(r"Read-only file system|Errno 30\b|\bEROFS\b")),
    # EACCES on a path or a login the job chose (an output directory it may not write, a
    # key ssh refuses); a shared file system's ACL or root squash reads the same, hence
    # side unknown. A container's device or /dev/shm refusing it is the runtime's (the
    # container rules come first). The words turn up beside other failures too (a shell
    # profile, a launcher's ssh probe), so any library's own error outranks them.
    Rule("permission_denied", F.BAD_CONFIG, _rx(
        r"Permission denied|Errno 13\b|\bEACCES\b"), side=Side.UNKNOWN, strength=_G),
    # NCCL's own verdict on the caller (ncclInvalidUsage: "invalid usage of NCCL
    # library"), e.g. two ranks on one GPU or mismatched arguments: the job, not the fabric.
    Rule("nccl_invalid_usage", F.BAD_CONFIG, _rx(
        r"ncclInvalidUsage|invalid usage of NCCL library|NCCL error[^\n]*invalid usage|"
        r"no algorithm/protocol available"),
        side=Side.USER),
    # NCCL told to use a network device or plugin it cannot find (NCCL_NET,
    # NCCL_IB_HCA, a plugin the image lacks): the job's NCCL settings.
    Rule("nccl_net_missing", F.BAD_CONFIG, _rx(r"NCCL WARN Could not find NET with id"),
         side=Side.USER),
    # NCCL finding no interface to bootstrap on: NCCL_SOCKET_IFNAME names one the node
    # does not have (the job's setting), or the node's interface is missing.
    Rule("nccl_no_interface", F.BAD_CONFIG, _rx(
        r"Bootstrap : no socket interface found|no socket interface found"),
        side=Side.UNKNOWN),
    # The verbs transport giving up on a peer (IBV_WC_RETRY_EXC_ERR, status 12; UCX's
    # "Transport retry count exceeded"): a flapping or broken link, but as often a RoCE
    # fabric the job's NCCL_IB_GID_INDEX / traffic class cannot route over (the peers
    # never answered). The node's link checks decide: unknown side.
    Rule("ib_retry_exceeded", F.NETWORK, _rx(
        r"completion (from peer \S+ )?with error 12\b|status=12\b|retry count(er)? exceeded|"
        r"RETRY_EXC"), side=Side.UNKNOWN),
    # Libfabric's providers (EFA, verbs, tcp) reporting a failed completion in their own
    # log format ("libfabric:PID:TIME::efa:cq:func():LINE<warn> err: 5, ..."), and the
    # AWS OFI NCCL plugin's own failures: the fabric, or a security group or an address
    # vector the cluster set up wrong; the line does not tell them apart.
    Rule("ofi_fabric", F.NETWORK, _rx(
        r"libfabric:\d+:\d+::\w+:\w+:\S+\(\):\d+<(warn|error)>[^\n]*\b(err|error|fail)|"
        r"NET/OFI[^\n]*(completed with error|Couldn't|failed|error)"), side=Side.UNKNOWN,
        accept=lambda line, log: not _NCCL_INFO.search(line)),
    Rule("fabric", F.NETWORK, _rx(
        r"NET/IB|NET/Socket|NCCL WARN NET|ibv_poll_cq|IBV_WC_\w+|completion[^\n]*status=\d+|"
        r"retry count(er)? exceeded|RETRY_EXC|UCX\s+ERROR|\bmlx5_?\d*\b[^\n]*(error|fail)|"
        r"ncclRemoteError|remote process exited or there was a network error|"
        r"NCCL error[^\n]*(remote error|network)|port state DOWN|"
        r"link (is )?down|Link flap"), accept=lambda line, log: not _NCCL_INFO.search(line)),
    # NCCL's system call failing (ncclSystemError, "unhandled system error"): a socket or
    # an InfiniBand verb, as often a container's shared memory or IPC namespace or a
    # limit: nothing in the words says which end or whose setting. Side unknown.
    Rule("nccl_system_error", F.NETWORK, _rx(r"ncclSystemError|unhandled system error"),
         side=Side.UNKNOWN, accept=lambda line, log: not _NCCL_INFO.search(line)),
    # NCCL's internal consistency checks failing (ncclInternalError): a bug in NCCL, or
    # memory it was handed corrupted; most often met in its transports. Side unknown.
    Rule("nccl_internal", F.NETWORK, _rx(
        r"ncclInternalError|NCCL error[^\n]*internal error"), side=Side.UNKNOWN),
    # The Hugging Face Hub refusing the job's request (huggingface_hub's and datasets'
    # exceptions): a gated model without accepted terms, a token that is wrong or missing,
    # a repository or dataset name that does not exist for this token. The job's
    # credentials or names, as a registry refusing an image is (container_auth).
    Rule("hub_refused", F.BAD_CONFIG, _rx(
        r"GatedRepoError|Cannot access gated repo|RepositoryNotFoundError|"
        r"Repository Not Found for url|Invalid user token|DatasetNotFoundError|"
        r"doesn't exist on the Hub or cannot be accessed"), side=Side.USER),
    Rule("service_down", F.EXTERNAL_SERVICE, _rx(
        r"429 Too Many Requests|50[234] (Server Error|Bad Gateway|Service Unavailable|"
        r"Gateway Time-?out)|rate limit exceeded|ReadTimeout|ConnectTimeout")),
    # Unreachable service: its outage, or the job's own offline/proxy settings.
    Rule("external", F.EXTERNAL_SERVICE, _rx(
        r"huggingface\.co|HfHubHTTPError|Max retries exceeded with url|HTTPSConnectionPool|"
        r"requests\.exceptions|urllib3\.exceptions|api\.wandb\.ai|wandb: ERROR|"
        r"Temporary failure in name resolution|\bHTTPError\b|raise_for_status|"
        r"\bRateLimitError\b|Error code: 429\b|rate_limit_exceeded|\bCommError\b|"
        r"LocalEntryNotFoundError|check your (internet )?connection|"
        r"Couldn't reach https?://|"
        # an HTTP download cut off by the server (requests/urllib3 wording)
        r"Connection broken: IncompleteRead|ChunkedEncodingError"),
        side=Side.UNKNOWN),
    # A rendezvous on a loopback address across nodes: the hostname resolves to 127.x.
    Rule("loopback", F.BAD_CONFIG, _rx(
        r"(connect|Connection)[^\n]*\[?127\.\d+\.\d+\.\d+\]?[^\n]*(refused|timed out)"),
        side=Side.UNKNOWN, strength=_G),
    # PyTorch's collective fingerprint check (TORCH_DISTRIBUTED_DEBUG / the flight
    # recorder): the ranks issued different collectives, the code's desync, not the fabric.
    Rule("collective_mismatch", F.JOB_HANG, _rx(
        r"SIZE_OR_SYNTAX_MISMATCH|COLLECTIVE_STATE_MISMATCH|Detected mismatch between "
        r"collectives"), side=Side.USER),
    Rule("hang", F.JOB_HANG, _rx(
        r"Watchdog caught collective operation timeout|collective operation timeout|"
        r"NCCL watchdog|ProcessGroupNCCL[^\n]*Timeout|Timed out waiting|"
        r"DistStoreError[^\n]*[Tt]ime|heartbeat monitor|hang detected|\bdeadlock")),
    # torch.distributed's store client unable to reach the rendezvous address at all
    # (TCPStore's connect, DistNetworkError): MASTER_ADDR, MASTER_PORT, the interface or
    # a firewall the job was set up with, far more often than a broken link; whichever
    # socket error it quotes.
    Rule("rendezvous_connect", F.BAD_CONFIG, _rx(
        r"The client socket has failed to connect to|DistNetworkError"),
        side=Side.UNKNOWN, strength=_G),
    Rule("peer_gone", F.NETWORK, _rx(
        r"Connection (closed|reset) by (remote )?peer|Broken pipe|remote process exited|"
        r"Connection refused|Gloo connectFullMesh failed"), secondary=True, strength=_G),
    # A socket error names the path to a peer, not which end broke: a link or a switch,
    # or an address, port, interface or firewall the job was set up with. The node's
    # own checks cannot see the other end: side unknown.
    Rule("socket", F.NETWORK, _rx(
        r"Socket Timeout|Network is unreachable|No route to host|Connection timed out|"
        r"Software caused connection abort|"
        r"ProcessGroupGloo[^\n]*timed out|c10d[^\n]*(socket|connect)[^\n]*(fail|error)"),
        side=Side.UNKNOWN, strength=_G),
    Rule("nan", F.NAN, _rx(
        r"FloatingPointError|Loss became infinite or NaN|diverged|non-finite (loss|grad)|"
        # a loss reported as nan/inf, its name a word or a suffix (total_loss, koleo_loss)
        r"(\b|_)loss\b[^\n]{0,20}\b(nan|inf)\b|NaN or Inf|Inf/NaN|nan loss|Detected NaN|"
        # torch.distributions' Normal given a NaN scale (a policy's std gone NaN)
        r"normal expects all elements of std >= 0\.0|"
        r"grad(ient)?s?[_ ]?(norm)?\b[^\n]{0,20}[:=][^\n]{0,3}\b(nan|inf)\b|"
        r"grad[_ ]norm[^\n]{0,20}\b(nan|inf)\b|returned nan values|"
        # DeepSpeed's and fairseq's fp16 loss scalers at their floor
        r"loss scale already at minimum|Minimum loss scale reached|"
        # the frameworks' own finiteness checks: TensorFlow's check_numerics, Keras'
        # TerminateOnNaN, Megatron's grad-norm check, clip_grad_norm_(error_if_nonfinite),
        # Lightning's finite checks, torch.distributions' argument validation, NumPy/SciPy/
        # scikit-learn refusing NaN input
        r"Tensor had (NaN|Inf) values|Invalid loss, terminating training|"
        r"found (NaN|Inf) in[^\n]*grad|is non-finite|\bis not finite\b|"
        r"to satisfy the constraint \w+\(\), but found invalid values|"
        r"Input contains (NaN|infinity)|must not contain infs or NaNs|"
        # TensorFlow's histogram summary refusing a non-finite value (summary_op.cc:
        # "Nan in summary histogram for: <tag>", "Infinity in ..."): a weight, gradient or
        # activation the job logs has gone NaN/Inf, whichever op reports it
        r"(Nan|Infinity) in summary histogram for\b")),
    # fp16 loss scaling skips a step on every overflow; one or two are routine, a run of
    # them halving the scale again and again is a numerical divergence.
    Rule("loss_scale_collapse", F.NAN, _rx(_OVERFLOW_STEP.pattern + "|" + _SCALE_VALUE.pattern),
         accept=_overflow_run),
    # A shell's bare "Killed" ending a line of loading progress (checkpoint shards, a
    # model's weights, a dataset): the process was SIGKILLed while it filled host memory
    # with them, the OOM killer's usual victim.
    Rule("killed_while_loading", F.CPU_OOM, _rx(
        r"(Loading (checkpoint shards|checkpoint|model|weights|dataset)|load_state_dict)"
        r"[^\n]*\bKilled\s*$", re.I | re.M), side=Side.UNKNOWN, strength=_G),
    Rule("oom_killer", F.CPU_OOM, _rx(
        r"Out of memory: Kill(ed)? process|invoked oom-killer|oom-kill|oom_kill_process|"
        r"oom_kill events?\b|have been OOM Killed|task \d+: Out Of Memory|"
        r"Memory cgroup out of memory|MemoryError|std::bad_alloc|Cannot allocate memory|"
        r"Errno 12\b|\bENOMEM\b|DataLoader worker \(pid \S+\) is killed by signal: Killed|"
        r"exceeded memory limit|Unable to allocate [\d.]+ [KMGT]i?B|"
        # Slurm's accounting ("Exceeded job memory limit", the OUT_OF_MEMORY job state),
        # the kernel's oom_reaper, a container runtime's OOMKilled, PyTorch's CPU
        # allocator, Windows' commit limit, Java/Ray/TensorFlow host allocations
        r"Exceeded (job|step) memory limit|\bOUT_OF_ME(MORY|\+)|oom_reaper|\bOOMKilled\b|"
        r"\bOOM[- ]kill(ed|er)\b|DefaultCPUAllocator: (can't allocate memory|not enough "
        r"memory)|paging file is too small|java\.lang\.OutOfMemoryError|"
        r"OutOfMemoryError: Java heap|ray\.exceptions\.OutOfMemoryError|"
        r"node (is )?running low on memory|OOM when allocating[^\n]*device:CPU|"
        # PBS's and LSF's own records of a job killed at its memory limit
        r"PBS: job killed: v?mem \d+\w* exceeded limit|Job exceeded a memory resource "
        r"limit|TERM_MEMLIMIT: job killed")),
    Rule("cpu_overload", F.CPU_OVERLOAD, _rx(
        r"can't start new thread|pthread_create failed|Resource temporarily unavailable|"
        r"fork: retry")),
    # A kernel stack trace with no panic, OOM or I/O line to explain it.
    Rule("kernel_trace", F.KERNEL_PANIC, _rx(
        r"Call Trace:|RIP: 00\d\d:|^\s*(\[\s*\d+\.\d+\]\s*)?\w+\+0x[0-9a-f]+/0x[0-9a-f]+",
        re.I | re.M), strength=_K, accept=_kernel_trace_line),
    Rule("cuda", F.CUDA_ERROR, _rx(
        r"CUDA error|CUDA_ERROR_\w+|cudaError\w+|cuda runtime error \(\d+\)|"
        r"illegal memory access|illegal instruction was encountered|unspecified launch "
        r"failure|CUBLAS_STATUS_(EXECUTION_FAILED|INTERNAL_ERROR)|CUDNN_STATUS_"
        r"(EXECUTION_FAILED|INTERNAL_ERROR|MAPPING_ERROR)|ncclUnhandledCudaError|"
        r"unhandled cuda error|no CUDA-capable device|all CUDA-capable devices are busy|"
        # NCCL's own report of a CUDA call that failed inside it ("NCCL WARN Cuda failure
        # 1 'invalid argument'"); running out of memory is gpu_oom's
        r"NCCL WARN Cuda failure|"
        # ROCm's HSA runtime on a GPU page fault: its illegal memory access
        r"Memory access fault by GPU node")),
    # A compiled extension built against another version of the library it links
    # (flash-attn against another torch): the dynamic loader's "undefined symbol" on
    # import. The job's environment, a version mismatch.
    Rule("extension_abi", F.BAD_CONFIG, _rx(
        r"\.so[^\n]*: undefined symbol|"
        # NumPy's own check of a compiled module against the installed NumPy (2.x under a
        # module built for 1.x, or the reverse): the environment's package versions
        r"compiled using NumPy 1\.x cannot be run in|numpy\.core\.multiarray failed to "
        r"import|numpy\.dtype size changed, may indicate binary incompatibility"),
        side=Side.USER),
    # PyTorch's load_state_dict on a checkpoint that does not fit the model: the job's
    # code or checkpoint.
    Rule("state_dict_mismatch", F.USER_EXCEPTION, _rx(
        r"Error\(s\) in loading state_dict|(Missing|Unexpected) key\(s\) in state_dict|"
        r"size mismatch for \S+: copying a param"), side=Side.USER),
    # Python's own "No such file or directory" for a path the job named (a checkpoint,
    # a data file, an output directory that was never made): the job's paths or
    # arguments, or a shared file system missing on the node, so side unknown. A rename
    # ("src -> dst") that loses a race between ranks is the code's own exception.
    Rule("missing_path", F.BAD_CONFIG, _rx(
        r"FileNotFoundError: \[Errno 2\] No such file or directory: '[^'\n]*'(?! ->)"),
        side=Side.UNKNOWN),
    # A missing environment variable: CPython's os.environ raising KeyError from its
    # __getitem__ (a launcher or platform variable the job expected). The job's setting or
    # the platform's environment; the frame does not say which.
    Rule("missing_env_var", F.BAD_CONFIG, _rx(r'os\.py", line \d+, in __getitem__'),
         side=Side.UNKNOWN, accept=lambda line, log: "KeyError" in log),
    # The job's own arguments refused before it ran: argparse's, click's and absl's
    # usage errors, Hydra's overrides, Open MPI asked for more ranks than the allocation
    # has slots. These print no traceback (argparse exits 2).
    Rule("launch_args", F.BAD_CONFIG, _rx(
        r"error: (unrecognized arguments|the following arguments are required|"
        r"argument \S+: (invalid|expected)|ambiguous option)|"
        r"Error: (No such option|Invalid value for|Missing option|Got unexpected extra "
        r"argument)|Flags parsing error|Unknown command line flag|"
        r"Could not override '|Could not append to config|"
        r"There are not enough slots available in the system|"
        # torch.distributed's env:// rendezvous started without the launcher's variables
        r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|LOCAL_RANK) "
        r"expected, but not set"), side=Side.USER),
    # A parallelism or batch layout that does not fit the model or the world size
    # (Megatron's and DeepSpeed's own checks, transformers' head split): the job's
    # arguments, not its code.
    Rule("parallel_layout", F.BAD_CONFIG, _rx(
        r"(should|must|needs to) be divisible by|is not divisible by|"
        r"train_batch_size is not equal to micro_batch_per_gpu|"
        r"is not a multiple of the number of attention heads"), side=Side.USER),
    # A framework refusing a combination of the job's own settings in an error
    # ("ValueError: DeepSpeed Zero-3 is not compatible with `low_cpu_mem_usage=True`",
    # "... are mutually exclusive"): the job's configuration, checked before it ran.
    Rule("incompatible_settings", F.BAD_CONFIG, _rx(
        r"(Error|Exception)\b[^\n]*\b(is not compatible with|are mutually exclusive|"
        r"cannot be used (together )?with|is only supported (when|with|for)|"
        r"is not supported (when|with|for))\b"), side=Side.USER),
    # Hydra reports the job's failure without a traceback ("Error executing job with
    # overrides", then the message, then how to get the stack trace): an error of the
    # job's own code or config, unless a line above names a cause a rule knows.
    Rule("hydra_job_error", F.USER_EXCEPTION, _rx(
        r"Error executing job with overrides|HYDRA_FULL_ERROR=1 for a complete stack trace"),
        side=Side.UNKNOWN),
    # Ray's wrapper around a task's own exception ("ray.exceptions.RayTaskError(TypeError):
    # ray::PPO.train()"): that exception, raised in the job's code on a worker.
    Rule("ray_task_error", F.USER_EXCEPTION, _rx(r"RayTaskError\(\w+\)"),
         side=Side.UNKNOWN, strength=_G),
    Rule("signal", F.WORKER_SIGNAL, _rx(
        r"is killed by signal|Segmentation fault|SIGSEGV|SIGBUS|Bus error|core dumped|"
        r"Fatal Python error|^\s*\**Killed\**\s*$|Signal \d+ \(SIG\w+\) received|"
        r"received signal SIG\w+|exitcode\s*:\s*-\d+|"
        # torch.multiprocessing.spawn's report of a child killed by a signal: a signal
        # death, not the Python exception that carries the news
        r"terminated with signal SIG\w+", re.I | re.M), strength=_G),
    # torchrun's summary of a worker that exited non-zero (its traceback elsewhere).
    Rule("torchrun_child", F.USER_EXCEPTION, _rx(
        r"ChildFailedError|exitcode\s*:\s*[1-9]\d*\b|elastic/errors\.html"),
        side=Side.UNKNOWN, strength=_G),
)

# The driver's own attribution: "Xid 45 ... caused by previous Xid 149" (45 is cleanup).
_XID_CAUSE = _rx(r"caused by previous Xid\s*(\d+)")
_XID = _rx(r"\bXid\b\s*(?:\([^)]*\))?\s*[:,]?\s*(?:error\s*)?(\d+)")
_EXC_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|"
                       + "|".join(_USER_EXC) + r")(: (?P<msg>.*))?$")
# Launcher prefixes in front of a worker's own lines: torchrun's "[rank3]:" and
# "[default0]:", "[stderr]", srun -l's "3: ", mpirun's "[1,3]<stderr>:"; and the "> "
# of a log quoted in a report or an e-mail.
# A training progress line: a step time or rate, as the common loggers print them.
_PROGRESS = re.compile(r"\b(sec/batch|s/batch|sec/step|s/step|s/it|it/s|examples/sec|"
                       r"samples/s(ec)?|tokens/s(ec)?)\b|\bTime:?\s+\d+\.\d+", re.I)
_PREFIX = re.compile(r"^(\s*(\[rank\d+\]:|\[default\d+\]:|\[std(err|out)\]|\d+: |"
                     r"\[\d+,\d+\]<std(err|out)>:|>(?=\s|$)))+\s?")
# A logger's source location in front of a message ("[ops/summary_ops_v2.py:608] "), as
# absl and TensorFlow print an exception they log instead of raising.
_LOGGER_PREFIX = re.compile(r"^\s*\[[\w./-]+\.py:\d+\]\s+(?=[A-Za-z_][\w.]*(Error|Exception)\b)")
# Markup around a pasted exception line (backticks, bold, a list bullet): not its text.
_MARKUP = re.compile(r"^(?:[-*]\s+)?[`*]+|[`*]+$")
_FRAME = re.compile(r'^\s*File "?(?P<file>[^",]+)"?, line (?P<line>\d+), in (?P<func>\S+)')


@dataclass(frozen=True)
class Evidence:
    """Everything known about one failed worker.

    task_exit: the worker's ``slurm_robust.task_exit`` record (written by slurmstepd as
    root); it wins over the exit status the job itself saw. kernel_log: the node's kernel
    messages around the failure (dmesg/kmsg text lines). nvml: GPU probe readings by
    probe name (``xid_events``, ``ecc_uncorrectable``, ``gpu_count``, ``remap``; see
    slurm_robust.health.probes), as :func:`nvml_evidence` reads them.
    """

    exit_code: int | None = None
    signal: int | None = None
    log_tail: str = ""
    task_exit: Mapping[str, Any] | None = None
    kernel_log: Sequence[str] = ()
    nvml: Mapping[str, Any] = field(default_factory=dict)
    expected_gpus: int | None = None
    # The launcher's own record says the code or data changed since the last good run.
    # No log line can tell a code/data change from the error it causes; only this can.
    change_recorded: bool = False


@dataclass(frozen=True)
class Classification:
    """What a failed worker's evidence says."""

    cls: str
    category: str
    secondary: bool = False
    signature: str | None = None
    line: str = ""
    evidence: ExitEvidence = field(default_factory=ExitEvidence)
    side: str = Side.UNKNOWN.value
    action: str = Action.REATTEMPT.value
    source: str = "exit"  # which evidence decided: sentinel, nvml, kernel, log, exit, learned
    rule: str = "exit_status"  # the rule that decided (a LOG_RULES name, "nvml", ...)
    strength: str = Strength.GENERIC.label  # how strong its evidence is (Strength)

    @property
    def evicts(self) -> bool:
        """The node is blamed at once (only ever for an infrastructure-side decision)."""
        return self.action == Action.EVICT.value


def classify_failure(exit_code: int | None, sig: int | None, log_tail: str) -> Classification:
    """Classify a worker that exited with ``exit_code`` or was killed by ``sig``."""
    return classify(Evidence(exit_code=exit_code, signal=sig, log_tail=log_tail))


def classify(ev: Evidence, model: Model | None = None, learned: bool = True
             ) -> Classification:
    """Classify from all the evidence (see the module docstring for the order); a
    user-side error after a recorded code/data change is that change's, and so is an
    exit the evidence names no cause for (see :func:`_change_explains`). Where nothing
    names a cause, the learned model (``model``, else the shipped one; none with
    ``learned=False``) may name the class from the log's words (:func:`_learned`)."""
    c = _classify(ev)
    if ev.change_recorded and _change_explains(c):
        evidence: ExitEvidence = {**c.evidence, "change_recorded": True, "error_class": c.cls}
        return _make(F.CODE_DATA_CHANGE, evidence, c.line, "change",
                     signature=f"{F.CODE_DATA_CHANGE.value}:{c.signature}",
                     rule="change_record", strength=Strength[c.strength.upper()])
    if learned:
        return _learned(c, ev, model if model is not None else default_model())
    return c


#: The rules' answer the learned model may replace: the catch-all for an exit that no
#: rule, exception, Xid, kernel or NVML record explains. Cross-validation on the
#: development split (bench classify --cv) found the model worse than the rules'
#: weaker answers elsewhere (a signal line, an unknown exception, a broken connection).
LEARNED_FROM = "exit_status"
#: Classes a learned answer may name: none whose default action is an eviction (words
#: are no evidence of a hardware fault: with side unknown such a class would send every
#: unexplained exit to stop-time diagnosis, and a mistaken side would blame the node); none
#: that only the launcher's own records can tell (a change, a spike, the scheduler); and
#: not NaN, whose action is a rollback: the corpus's NaN excerpts are the words every
#: healthy training log prints ("loss", "step", "scale"), so a real log tail full of
#: progress lines would read as NaN to the model.
LEARNABLE = frozenset(row.cls.value for row in TABLE if row.action is not Action.EVICT) - {
    F.CODE_DATA_CHANGE.value, F.LOSS_SPIKE.value, F.ADMIN.value, F.TIME_LIMIT.value,
    F.PREEMPTED.value, F.NAN.value}
#: Fewer known words than this and the model's answer is little more than its prior.
MIN_KNOWN_WORDS = 3
#: The least probability the model must give its answer (over all classes, the ones it
#: may not name included): below it, the log reads as something it may not say (most
#: often a NaN or a hardware fault) or as nothing in particular, and the rules' answer
#: stands. A safety floor, not a tuned one: under cross-validation it costs a third of
#: an entry per run (no floor is best there; 0.3 costs more than one).
MIN_PROBABILITY = 0.2


#: What a line that reports a failure says; the model reads a log only when one of its
#: last lines does (LEARNED_LAST_LINES).
_ERROR_WORDS = re.compile(
    r"\b(errors?|exceptions?|fail(s|ed|ure|ing)?|fatal|abort(s|ed|ing)?|denied|refused|"
    r"invalid|cannot|can't|unable|not found|no such|killed|terminat\w*|timed? ?out|"
    r"traceback|panic\w*|unexpected|mismatch\w*|missing|exceeded|forbidden|"
    r"unauthori[sz]ed|not supported|unsupported|out of memory|oom)\b", re.I)
#: How far from the end of a log its last words may name the error (a framework may
#: print a line or two of shutdown after it).
LEARNED_LAST_LINES = 5
#: A warning names no failure, whatever its words (torch's c10d prints "The hostname of
#: the client socket cannot be retrieved" as a glog warning in every healthy run).
_WARNING_LINE = re.compile(r"^\s*\[?W\d{4} |\bwarn(ing)?\b|Warning:", re.I)


def _last_words_name_an_error(log: str) -> bool:
    """Whether the model may read this log: one of its last lines reports a failure (a
    shell's "Killed" after a progress bar does). The corpus the model learned from holds
    error excerpts only, so it has never seen a tail of ordinary output and reads its
    noise as some class with confidence: a SIGKILLed worker of the example script, whose
    tail is c10d warnings and "no checkpoint copies found", was read as ``bad_config`` at
    p 0.4, a silent exit 1 the same way. Such a worker is what the catch-all says."""
    lines = [ln for ln in log.splitlines() if ln.strip()][-LEARNED_LAST_LINES:]
    return any(_ERROR_WORDS.search(ln) and not _WARNING_LINE.search(ln) for ln in lines)


def model_features(ev: Evidence) -> set[str]:
    """What the learned model reads of a failure: the words of its log tail as the rules
    read it (launcher prefixes such as ``[rank3]:`` stripped, :func:`_normalise`) and its
    exit status as the classifier reads it (a task-exit record, a shell's 128+N). Training
    (classify_train) calls this too, so the model learns from the text it is shown."""
    code, sig = _exit_status(ev)
    return features(_normalise(ev.log_tail), code, sig)


def _learned(c: Classification, ev: Evidence, model: Model | None) -> Classification:
    """``c``, or the class the model reads in the log's words where ``c`` is the exit
    catch-all. A learned answer blames nobody: side unknown (whatever the class's usual
    side: the model's confidence is no evidence of whose fault it is), the weakest
    strength, never an evicting class; its evidence keeps the rules' answer."""
    if model is None or c.rule != LEARNED_FROM:
        return c
    code = c.evidence.get("exit_code")
    if not _last_words_name_an_error(_normalise(ev.log_tail)):
        return c
    guess = model.predict(model_features(ev), allowed=LEARNABLE)
    if guess is None or guess.known_words < MIN_KNOWN_WORDS or \
            guess.probability < MIN_PROBABILITY or guess.cls == c.cls:
        return c
    evidence: ExitEvidence = {k: v for k, v in c.evidence.items()  # type: ignore[assignment]
                              if k != "classifier"}
    made = _make(F(guess.cls), evidence, c.line, "learned", side=Side.UNKNOWN,
                 signature=f"{guess.cls}:learned:{evidence.get('signal_name', code)}",
                 rule="learned", strength=Strength.GENERIC)
    made.evidence["classifier"].update(
        probability=round(guess.probability, 3), words=list(guess.top_words),
        model_version=int(model.meta.get("model_version", 0)), rules_said=c.cls)
    return made


def _change_explains(c: Classification) -> bool:
    """Whether a recorded code/data change is the likeliest cause of ``c``.

    A user-side error, or a worker that ended itself (a non-zero exit status, no signal)
    with nothing in the evidence naming a cause: an exception the patterns do not know
    (user_exception of unknown side) or no error line at all. That is ByteRobust's "crash
    with no clear culprit" right after a change, which its ladder settles by rolling the
    change back. Anything with a named cause (a CUDA, NCCL, disk or memory error, a
    signal, a secondary failure) keeps its class: a change does not explain a fault the
    evidence names, and those classes go to diagnosis, not to a rollback.
    """
    if c.side == Side.USER.value:
        return True
    if c.side != Side.UNKNOWN.value or c.secondary:
        return False
    self_exit = c.evidence.get("signal") is None and c.evidence.get("exit_code") not in (None, 0)
    return self_exit and c.cls in (F.USER_EXCEPTION.value, F.WORKER_SIGNAL.value)


def _classify(ev: Evidence) -> Classification:
    code, sig = _exit_status(ev)
    evidence: ExitEvidence = {"exit_code": code, "signal": sig}
    if sig is not None:
        evidence["signal_name"] = _signame(sig)
    if ev.task_exit is not None:
        te = ev.task_exit
        evidence["task_exit"] = {"node": te.get("node"), "job_id": te.get("job_id"),
                                 "step_id": te.get("step_id"), "task_id": te.get("task_id"),
                                 "wait_status": te.get("wait_status")}
    log = _normalise(ev.log_tail)
    last = _last_line(log)
    if code == EXIT_NONFINITE:
        return _make(F.NAN, evidence, last, "sentinel", signature="nan",
                     rule="exit_sentinel", strength=_L)
    if code == EXIT_SPIKE:
        return _make(F.LOSS_SPIKE, evidence, last, "sentinel", signature="loss_spike",
                     rule="exit_sentinel", strength=_L)
    hw = _nvml_verdict(ev, evidence)
    if hw is not None:
        return _make(hw[0], evidence, hw[1], "nvml", signature=hw[0].value, rule="nvml",
                     strength=_H)
    kernel = _kernel_verdict(ev.kernel_log, sig, evidence)
    if kernel is not None:
        # An Xid or a lost GPU is the hardware's report, relayed by the kernel.
        hardware = kernel[0] in (F.GPU_MEMORY_ERROR, F.GPU_UNAVAILABLE)
        return _make(kernel[0], evidence, kernel[1], "kernel", signature=kernel[0].value,
                     rule="kernel_log", strength=_H if hardware else _K)
    found = _xid_verdict(log, evidence)
    if found is not None and found[0] in (F.GPU_MEMORY_ERROR, F.GPU_UNAVAILABLE):
        return _make(found[0], evidence, found[1], "log", signature=found[0].value,
                     rule="xid", strength=_H)
    exc = last_exception(log)
    matches = log_matches(log, app_xid=found is not None)
    if matches:
        rule, line = _strongest(matches)
        evidence["log_line"] = line
        sig_part = f"{rule.cls.value}:{exc[0]}" if exc else rule.cls.value
        outranked = [r.name for r, _ in matches if r is not rule]
        return _make(rule.cls, evidence, line, "log", side=rule.side,
                     secondary=rule.secondary, signature=sig_part, rule=rule.name,
                     strength=rule.strength, outranked=outranked)
    if found is not None:
        # Xid 13/31/43/45 are usually the application's doing, but a failing GPU can raise
        # them too: user side only once diagnosis has passed the node. Other Xids outside
        # the hardware list are CUDA errors of unknown side.
        side = Side.INFRASTRUCTURE if "xid_cause" in evidence else Side.UNKNOWN
        return _make(found[0], evidence, found[1], "log", side=side,
                     signature=f"{found[0].value}:xid", rule="xid_application",
                     strength=_L)
    if exc is not None:
        name, msg, where = exc
        evidence.update(exception=name, message=msg[:300], where=where)
        short = name.split(".")[-1]
        if short in ("KeyboardInterrupt", "SystemExit"):
            return _make(F.WORKER_SIGNAL, evidence, f"{name}: {msg}"[:300], "log",
                         signature=f"{name}@{where}", rule="exception", strength=_L)
        side = Side.USER if short in _USER_EXC else Side.UNKNOWN
        return _make(F.USER_EXCEPTION, evidence, f"{name}: {msg}"[:300], "log", side=side,
                     signature=f"{name}@{where}", rule="exception", strength=_L)
    if code is None and sig is None:
        progress = [line for line in log.splitlines() if _PROGRESS.search(line)]
        if len(progress) >= 2:
            # No exit and no error, but step-rate lines: the worker was running and
            # reporting steps when the incident was raised, so it is a slowdown. The log
            # does not say whose: unknown side, diagnosis before any blame.
            evidence["progress_lines"] = len(progress)
            return _make(F.MFU_DECLINE, evidence, progress[-1], "log", side=Side.UNKNOWN,
                         signature=F.MFU_DECLINE.value, rule="progress_lines", strength=_G)
    return _make(F.WORKER_SIGNAL, evidence, last, "exit",
                 signature=f"worker_signal:{evidence.get('signal_name', code)}",
                 rule="exit_status", strength=_G)


def log_matches(log: str, app_xid: bool = False) -> list[tuple[Rule, str]]:
    """Every log rule that matches ``log`` (normalised) with the newest line it matched,
    in rule order. With an application Xid in the log, the rules from the generic CUDA
    error on are left out: the Xid names that error more precisely."""
    found: list[tuple[Rule, str]] = []
    for rule in LOG_RULES:
        if app_xid and rule.cls is F.CUDA_ERROR:
            break
        line = _search(rule.pattern, log, rule.accept)
        if line is not None:
            found.append((rule, line))
    return found


def strongest_match(log: str, app_xid: bool = False) -> tuple[Rule, str] | None:
    """The matching rule with the strongest evidence; ties go to the earlier rule."""
    matches = log_matches(log, app_xid)
    return _strongest(matches) if matches else None


def _strongest(matches: Sequence[tuple[Rule, str]]) -> tuple[Rule, str]:
    best = max(rule.strength for rule, _ in matches)
    return next(m for m in matches if m[0].strength == best)


def nvml_evidence(view: Any) -> NvmlReadings:
    """Read the GPU probes the classifier uses through a health ProbeView
    (``Probes(...).view()``); {} on a node without NVML (nothing injected)."""
    try:
        return dict(view.gpu("xid_events", "ecc_uncorrectable", "gpu_count", "remap"))
    except NoNVMLError:
        return {}


def last_exception(log_tail: str) -> tuple[str, str, str] | None:
    """(exception name, message, "file:line" of the innermost frame) of the last
    traceback in the tail, or None."""
    lines = [_LOGGER_PREFIX.sub("", _PREFIX.sub("", line)) for line in log_tail.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        match = _EXC_LINE.match(_MARKUP.sub("", lines[i].strip()).strip())
        if match is None:
            continue
        where = ""
        for j in range(i - 1, max(-1, i - 60), -1):
            frame = _FRAME.match(lines[j])
            if frame:
                where = f"{frame['file'].rsplit('/', 1)[-1]}:{frame['line']}"
                break
        # A bare exception line counts for the builtin user exceptions, or as the tail's
        # last line (what a process printed as it died); elsewhere a quoted
        # "SomethingError: ..." in a message is not a raised exception.
        if not where and "Traceback" not in log_tail and match["name"] not in _USER_EXC \
                and any(rest.strip() for rest in lines[i + 1:]):
            continue
        return match["name"], match["msg"] or "", where
    return None


def _make(cls: FailureClass, evidence: ExitEvidence, line: str, source: str,
          side: Side | None = None, secondary: bool = False,
          signature: str | None = None, rule: str = "exit_status",
          strength: Strength = Strength.GENERIC,
          outranked: Sequence[str] = ()) -> Classification:
    row = ROWS[cls]
    side = side or row.side
    action = row.action
    # Eviction needs infrastructure-side evidence; anything less goes to diagnosis.
    if action is Action.EVICT and side is not Side.INFRASTRUCTURE:
        action = Action.DIAGNOSE
    # Why this class (and so why the node was or was not blamed), for the incident record
    # and its post-mortem reader: docs/SCHEMAS.md, incident evidence.classifier.
    why: ClassifierEvidence = {"rule": rule, "strength": strength.label, "line": line[:300],
                               "source": source, "side": side.value}
    if outranked:
        why["outranked"] = list(outranked)
    evidence["classifier"] = why
    return Classification(cls.value, row.category.value, secondary=secondary,
                          signature=signature, line=line[:300], evidence=evidence,
                          side=side.value, action=action.value, source=source, rule=rule,
                          strength=strength.label)


def _exit_status(ev: Evidence) -> tuple[int | None, int | None]:
    if ev.task_exit is not None:  # written by root: it wins over what the job saw
        return ev.task_exit.get("exit_code"), ev.task_exit.get("signal")
    code, sig = ev.exit_code, ev.signal
    if sig is None and code is not None and 128 < code < 160:  # a shell's 128+N
        return code, code - 128
    return code, sig


def _nvml_verdict(ev: Evidence, evidence: ExitEvidence) -> tuple[FailureClass, str] | None:
    nv = ev.nvml or {}
    ecc = [int(n) for n in (nv.get("ecc_uncorrectable") or []) if n]
    if ecc:
        evidence["nvml"] = {"ecc_uncorrectable": nv.get("ecc_uncorrectable")}
        return F.GPU_MEMORY_ERROR, f"NVML: {sum(ecc)} uncorrectable ECC error(s)"
    for gpu, r in enumerate(nv.get("remap") or []):
        if r and r.get("failure"):
            evidence["nvml"] = {"remap": nv.get("remap")}
            return F.GPU_MEMORY_ERROR, f"NVML: row-remap failure on GPU {gpu}"
    xids = [int(e["xid"]) for e in (nv.get("xid_events") or [])]
    hard = [x for x in xids if x in XID_MEMORY or x in XID_UNAVAILABLE]
    if xids:
        evidence["xids"] = xids
    if hard:
        cls = F.GPU_MEMORY_ERROR if hard[0] in XID_MEMORY else F.GPU_UNAVAILABLE
        return cls, f"NVML: Xid {hard[0]}"
    count, expected = nv.get("gpu_count"), ev.expected_gpus
    if count is not None and expected is not None and int(count) < expected:
        evidence["nvml"] = {"gpu_count": count, "expected": expected}
        return F.GPU_UNAVAILABLE, f"NVML: {count} GPUs, expected {expected}"
    return None


#: Kernel events and the class each names, strongest first (a lost GPU explains a panic
#: or an I/O error after it; an OOM kill counts only for a SIGKILLed worker).
_KERNEL_CLASSES: tuple[tuple[KernelEventKind, FailureClass], ...] = (
    (KernelEventKind.GPU_LOST, F.GPU_UNAVAILABLE), (KernelEventKind.PANIC, F.KERNEL_PANIC),
    (KernelEventKind.IO_ERROR, F.DISK_FAULT), (KernelEventKind.OOM, F.CPU_OOM))


def _kernel_verdict(kernel_log: Sequence[str], sig: int | None,
                    evidence: ExitEvidence) -> tuple[FailureClass, str] | None:
    """The class the node's kernel messages name, and the line, or None.

    Only kernel-originated formats anchored at the start of a message count
    (``health.kernel_formats``, shared with the monitor and the GPU check): a process or
    file name in a segfault or traps line is the user's text, whatever it says.
    """
    events = [e for e in (parse_text(line) for line in kernel_log) if e is not None]
    for e in events:
        if e.kind is KernelEventKind.XID and e.xid is not None:
            evidence.setdefault("xids", [])
            if e.xid not in evidence["xids"]:
                evidence["xids"].append(e.xid)
            if e.xid in XID_MEMORY:
                return F.GPU_MEMORY_ERROR, e.text[:300]
            if e.xid in XID_UNAVAILABLE:
                return F.GPU_UNAVAILABLE, e.text[:300]
    hung = [e.text for e in events if e.kind is KernelEventKind.HUNG_TASK]
    if hung:
        evidence["kernel_hung_task"] = hung[-1][:300]  # a slow disk's sign, not a panic
    for kind, cls in _KERNEL_CLASSES:
        lines = [e.text for e in events if e.kind is kind]
        if not lines:
            continue
        line = lines[-1][:300]  # the newest is nearest the failure
        if cls is F.CPU_OOM and sig != signal.SIGKILL:
            # The OOM killer names the victim by signal: only a SIGKILLed worker was it.
            evidence["kernel_oom"] = line
            continue
        evidence["kernel_line"] = line
        return cls, line
    return None


def _xid_verdict(text: str, evidence: ExitEvidence) -> tuple[FailureClass, str] | None:
    """The first hardware Xid in ``text`` (else an application one) and its line."""
    app = None
    for line in text.splitlines():
        for m in _XID.finditer(line):
            xid = int(m.group(1))
            evidence.setdefault("xids", [])
            if xid not in evidence["xids"]:
                evidence["xids"].append(xid)
            if xid in XID_MEMORY:
                return F.GPU_MEMORY_ERROR, line.strip()
            if xid in XID_UNAVAILABLE:
                return F.GPU_UNAVAILABLE, line.strip()
            cause = _XID_CAUSE.search(line)
            if cause is not None and int(cause.group(1)) not in XID_APPLICATION:
                # An application-looking Xid the driver blames on an earlier non-application
                # one (NVLink, a GPU error): the earlier Xid is the fault, not the code.
                evidence["xid_cause"] = int(cause.group(1))
                app = app if app is not None and app[0] is F.CUDA_ERROR else \
                    (F.CUDA_ERROR, line.strip())
            elif app is None:
                app = (F.USER_CUDA_FAULT if xid in XID_APPLICATION else F.CUDA_ERROR,
                       line.strip())
    return app


def _normalise(text: str) -> str:
    return "\n".join(_PREFIX.sub("", line) for line in text.splitlines())


def _search(pattern: re.Pattern[str], text: str,
            accept: Callable[[str, str], bool] | None = None) -> str | None:
    """The last line the pattern matches (the newest is nearest the failure) and
    ``accept`` (given the line and the whole text) takes."""
    for m in reversed(list(pattern.finditer(text))):
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.end())
        line = text[start:end if end >= 0 else len(text)]
        # Indentation (a log quoted or nested in another tool's output) is not part of
        # the message that the accept checks read.
        if accept is None or accept(line.strip(), text):
            return line.strip()[:300]
    return None


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
