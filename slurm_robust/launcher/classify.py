"""Classify a failed worker from its exit status and the tail of its log (pure).

The classes are the incident taxonomy of docs/SCHEMAS.md. Patterns are checked in
order; the first match wins, so hardware and driver errors (which often come with a
Python traceback of their own) are checked before user exceptions.

A worker whose peer died sees a broken connection ("Connection closed by peer" from
gloo, NCCL "remote process exited"); that is a *secondary* failure: the controller waits
a little for the primary one (the killed worker, the lost node) before deciding.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any

#: Exit code the training API uses when a step's loss or grad norm is not finite.
EXIT_NONFINITE = 87
#: Exit code the training API uses for a loss or grad-norm spike.
EXIT_SPIKE = 88

CATEGORY = {
    "cuda_error": "explicit", "nccl_error": "explicit", "gpu_memory_error": "explicit",
    "oom": "explicit", "cpu_oom": "explicit", "network_error": "explicit",
    "disk_error": "explicit", "node_lost": "explicit", "worker_crash": "explicit",
    "user_code": "explicit", "kernel_panic": "explicit",
    "hang": "implicit", "nan": "implicit", "loss_spike": "implicit", "fail_slow": "implicit",
    "code_change": "manual", "admin": "manual",
}

#: Classes that name the node as the culprit at once (evict it, do not retry on it).
NODE_CLASSES = frozenset({"node_lost", "gpu_memory_error", "cuda_error", "kernel_panic",
                          "disk_error"})

_USER_EXC = ("TypeError", "IndexError", "KeyError", "AttributeError", "NameError",
             "ValueError", "ZeroDivisionError", "AssertionError", "ImportError",
             "ModuleNotFoundError", "SyntaxError", "NotImplementedError", "UnboundLocalError")

# (class, regex) in priority order.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu_memory_error", re.compile(r"\bXid\b.*\b(48|63|64|74|79|94|95)\b|uncorrectable ECC|"
                                    r"ECC error|double bit ecc", re.I)),
    ("cuda_error", re.compile(r"CUDA error|CUDA_ERROR_|cudaError|\bXid\b|"
                              r"device-side assert|illegal memory access", re.I)),
    ("oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED")),
    ("nccl_error", re.compile(r"NCCL (error|WARN.*timeout)|ncclSystemError|ncclInternalError|"
                              r"ncclUnhandledCudaError|NCCL communicator was aborted|"
                              r"Watchdog caught collective operation timeout", re.I)),
    ("cpu_oom", re.compile(r"MemoryError|Cannot allocate memory|std::bad_alloc|oom-kill", re.I)),
    ("disk_error", re.compile(r"No space left on device|Input/output error|"
                              r"Read-only file system", re.I)),
    ("network_error", re.compile(r"Connection (closed|reset) by peer|Broken pipe|"
                                 r"Connection refused|Gloo connectFullMesh failed|"
                                 r"Socket Timeout|remote process exited|"
                                 r"Network is unreachable|ProcessGroupGloo.*(timed out|Timed out)",
                                 re.I)),
)
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|remote process exited|"
                        r"Connection refused|Gloo connectFullMesh failed", re.I)
_EXC_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(Error|Exception|Interrupt)|"
                       + "|".join(_USER_EXC) + r")(: (?P<msg>.*))?$")
# torch.distributed prefixes a worker's traceback lines with "[rankN]: ".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


@dataclass(frozen=True)
class Classification:
    """What a failed worker's status and log say."""

    cls: str
    category: str
    secondary: bool = False
    signature: str | None = None
    line: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


def classify_failure(exit_code: int | None, sig: int | None, log_tail: str) -> Classification:
    """Classify a worker that exited with ``exit_code`` or was killed by ``sig``."""
    evidence: dict[str, Any] = {"exit_code": exit_code, "signal": sig}
    if sig is not None:
        evidence["signal_name"] = _signame(sig)
    if exit_code == EXIT_NONFINITE:
        return Classification("nan", "implicit", evidence=evidence, line=_last_line(log_tail),
                              signature="nan")
    if exit_code == EXIT_SPIKE:
        return Classification("loss_spike", "implicit", evidence=evidence,
                              line=_last_line(log_tail), signature="loss_spike")
    if sig == signal.SIGKILL and _oom_killed(log_tail):
        return Classification("cpu_oom", "explicit", evidence=evidence, line="killed (oom)")
    exc = last_exception(log_tail)
    for cls, pattern in _PATTERNS:
        match = _search_tail(pattern, log_tail)
        if match is not None:
            secondary = cls == "network_error" and _PEER_GONE.search(match) is not None
            evidence["log_line"] = match
            return Classification(cls, CATEGORY[cls], secondary=secondary, line=match,
                                  evidence=evidence,
                                  signature=f"{cls}:{exc[0]}" if exc else cls)
    if exc is not None and exc[0].split(".")[-1] in _USER_EXC:
        name, msg, where = exc
        evidence.update(exception=name, message=msg[:300], where=where)
        return Classification("user_code", "explicit", line=f"{name}: {msg}"[:300],
                              evidence=evidence, signature=f"{name}@{where}")
    line = f"{exc[0]}: {exc[1]}"[:300] if exc else _last_line(log_tail)
    if exc:
        evidence.update(exception=exc[0], message=exc[1][:300], where=exc[2])
    return Classification("worker_crash", "explicit", line=line, evidence=evidence,
                          signature=f"worker_crash:{exc[0]}@{exc[2]}" if exc else None)


def last_exception(log_tail: str) -> tuple[str, str, str] | None:
    """(exception name, message, "file:line" of the innermost frame) of the last
    traceback in the tail, or None."""
    lines = [_RANK_PREFIX.sub("", line) for line in log_tail.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        match = _EXC_LINE.match(lines[i].strip())
        if match is None:
            continue
        where = ""
        for j in range(i - 1, max(-1, i - 60), -1):
            frame = _FRAME.match(lines[j])
            if frame:
                where = f"{frame['file'].rsplit('/', 1)[-1]}:{frame['line']}"
                break
        if not where and "Traceback" not in log_tail:
            continue
        return match["name"], match["msg"] or "", where
    return None


def _search_tail(pattern: re.Pattern[str], text: str) -> str | None:
    for line in reversed(text.splitlines()):
        if pattern.search(line):
            return line.strip()[:300]
    return None


def _oom_killed(text: str) -> bool:
    return re.search(r"Out of memory: Killed process|oom-kill", text) is not None


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
