"""Kernel-log lines that matter to a running job: GPU Xids and lost GPUs, the OOM killer,
panics, I/O errors and hung tasks, scanned from ``/dev/kmsg`` records
(``pri,seq,usec,flags;text``).

The records come from the ``kernel_log`` probe (one reader, ``nvml.read_kmsg``, behind
the probe layer, so a rehearsal injects lines). Which lines count is decided by
``kernel_formats`` (anchored kernel-originated formats only, shared with the GPU check's
Xid source and the classifier), so a process name or file name a user chooses never
becomes an event. The caller keeps the cursor (the highest sequence number seen), so
each line is reported once.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_robust.health.kernel_formats import KernelEventKind, parse_record, split_record

__all__ = ["KernelEvent", "KernelEventKind", "scan"]


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
        record = split_record(line)
        if record is None:
            continue
        last = max(last, record.seq)
        if record.seq <= after_seq:
            continue
        found = parse_record(record)
        if found is not None:
            events.append(KernelEvent(record.seq, found.kind, found.text[:300], found.xid,
                                      found.bus))
    return events, last
