"""Kernel-log lines that matter to a running job: GPU Xids, the OOM killer, panics and
I/O errors, scanned from ``/dev/kmsg`` records (``pri,seq,usec,flags;text``).

The records come from the ``kernel_log`` probe (one reader, ``nvml.read_kmsg``, behind
the probe layer, so a rehearsal injects lines); Xid lines are parsed by the same
``parse_kmsg_xids`` the GPU check's kernel-log source uses. The caller keeps the cursor
(the highest sequence number seen), so each line is reported once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from slurm_robust.health.nvml import parse_kmsg_xids


class KernelEventKind(StrEnum):
    XID = "xid"
    OOM = "oom_kill"
    PANIC = "panic"
    IO_ERROR = "io_error"


_PATTERNS: tuple[tuple[KernelEventKind, re.Pattern[str]], ...] = (
    (KernelEventKind.OOM, re.compile(r"Out of memory: Killed process|oom-kill:|"
                                     r"invoked oom-killer")),
    (KernelEventKind.PANIC, re.compile(r"Kernel panic|BUG: unable to handle|"
                                       r"general protection fault|hard LOCKUP|"
                                       r"Machine check events logged|mce: \[Hardware Error\]")),
    (KernelEventKind.IO_ERROR, re.compile(r"I/O error|Buffer I/O error|EXT4-fs error|"
                                          r"XFS \(.*\): .*(?:error|shutdown)|"
                                          r"Remounting filesystem read-only")),
)


@dataclass(frozen=True)
class KernelEvent:
    seq: int
    kind: KernelEventKind
    text: str
    xid: int | None = None
    bus: str | None = None


def scan(lines: list[str], after_seq: int) -> tuple[list[KernelEvent], int]:
    """Events in records with seq > ``after_seq``, and the highest seq seen."""
    events: list[KernelEvent] = []
    last = after_seq
    for line in lines:
        head, _, text = line.partition(";")
        parts = head.split(",")
        if len(parts) < 2 or not parts[1].strip().isdigit():
            continue
        seq = int(parts[1])
        last = max(last, seq)
        if seq <= after_seq:
            continue
        xids, _ = parse_kmsg_xids([line], seq - 1)
        if xids:
            bus, xid = xids[0]
            events.append(KernelEvent(seq, KernelEventKind.XID, text[:300], xid, bus))
            continue
        for kind, pattern in _PATTERNS:
            if pattern.search(text):
                events.append(KernelEvent(seq, kind, text[:300]))
                break
    return events, last
