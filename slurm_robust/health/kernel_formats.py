"""The kernel-log line formats this package acts on, in one place (pure).

Three consumers read the kernel log: the GPU check's Xid source (``nvml.parse_kmsg_xids``,
root, drains the node), the in-job monitor (``kernlog.scan``, a fatal finding evicts the
node) and the failure classifier (``launcher.classify``, an infrastructure class evicts).
All three decide through :func:`parse_text` / :func:`parse_record` here.

Why anchored: any local user chooses text that the kernel prints verbatim. A process name
(``comm``, up to 15 bytes, ``prctl(PR_SET_NAME)``) starts every ``segfault at`` line and
sits inside ``traps:`` lines; a mapped file's name ends a segfault line (``in <file>``);
the OOM killer and the Xid lines name the process too. A pattern searched *anywhere* in
a line is therefore a pattern any user can print, and a user-space general protection
fault (``traps: python[12] general protection fault ip:...``) matched the old
"general protection fault" panic pattern with no crafting at all.

So a line counts only when the *start* of its message text (after the kmsg header or a
dmesg/journal timestamp) is a kernel-originated format below, and the kind is decided by
that anchor alone: text after a process-name slot is never looked at. Lines of the
families that begin with a process name (``<comm>[pid]: segfault at``, ``<comm> invoked
oom-killer``, ``<comm>: page allocation failure``) and ``traps:`` lines are refused
before any anchor is tried, so a name chosen to look like an anchor does not pass. In
``/dev/kmsg`` records, only the kernel facility (0) counts: a write to ``/dev/kmsg`` from
user space is logged as LOG_USER whatever it asks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class KernelEventKind(StrEnum):
    XID = "xid"
    GPU_LOST = "gpu_lost"
    OOM = "oom_kill"
    PANIC = "panic"
    IO_ERROR = "io_error"
    HUNG_TASK = "hung_task"  # a task blocked in D state: worth a warning, never a panic


@dataclass(frozen=True)
class KernelLine:
    """One recognised kernel message."""

    kind: KernelEventKind
    text: str  # the message text, prefix removed
    xid: int | None = None
    bus: str | None = None  # normalised PCI bus id of an Xid


# Families whose text starts with (or, for traps, is built around) a user-chosen process
# name. Each pattern is longer than a process name can be (15 bytes), so a name inside a
# genuine line elsewhere (an Xid's ``name=``) cannot make that line refused.
_USER_NAMED = re.compile(
    r"^traps: "
    r"|\[\d+\]: segfault at [0-9a-fA-F]+ ip "
    r"|\[\d+\]:? (?:general protection fault|trap \w+|unhandled \w+) .*\bip:? ?[0-9a-fA-F]+"
    r"| invoked oom-killer: gfp_mask=0x"
    r"|: page allocation failure: order:\d+")

_BUS = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-9A-Fa-f])?"

# Each anchor is matched at the start of the message text (re.match), and the kind is
# the anchor's. Formats as the kernel and the NVIDIA driver print them.
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<bus>{_BUS})\): (?P<xid>\d{{1,4}})\b")
_ANCHORS: tuple[tuple[KernelEventKind, re.Pattern[str]], ...] = (
    (KernelEventKind.GPU_LOST, re.compile(
        rf"NVRM: (?:GPU (?:at )?(?:PCI:)?{_BUS}: )?"
        r"(?:GPU has fallen off the bus|GPU is lost|RmInitAdapter failed|"
        r"The NVIDIA probe routine failed|API mismatch)")),
    (KernelEventKind.PANIC, re.compile(
        r"Kernel panic - not syncing: "
        r"|BUG: unable to handle (?:kernel|page fault|paging request)"
        r"|BUG: kernel NULL pointer dereference, address: "
        r"|Unable to handle kernel (?:paging request|NULL pointer dereference) at "
        r"|kernel BUG at \S+:\d+!"
        r"|Oops: .*\[#\d+\]"
        r"|general protection fault(?:, [^:]*)?(?:: 0x[0-9a-f]+)?: [0-9a-f]{4} \[#\d+\]"
        r"|(?:NMI )?watchdog: Watchdog detected hard LOCKUP on cpu \d+"
        r"|mce: \[Hardware Error\]: "
        r"|Machine check events logged")),
    (KernelEventKind.IO_ERROR, re.compile(
        r"(?:(?:blk_update_request|print_req_error): )?"
        r"(?:critical (?:medium|target|nexus|space allocation|protection) |)"
        r"(?:I/O )?error, dev \S+, sector \d+"
        r"|Buffer I/O error on dev(?:ice)? \S+, logical block \d+"
        r"|EXT4-fs error \(device [^)\s]+\): "
        r"|EXT4-fs \([^)\s]+\): (?:Remounting filesystem read-only|I/O error)"
        r"|XFS \([^)\s]+\): (?:metadata I/O error|Corruption|Filesystem has been shut down|"
        r"Log I/O Error|.{0,80}I/O Error Detected\. Shutting down filesystem)"
        r"|JBD2: Detected IO errors"
        r"|nvme nvme\d+: I/O \d+ (?:\(\S+\) )?QID \d+ timeout"
        r"|ata\d+(?:\.\d+)?: (?:exception Emask|failed command: (?:READ|WRITE))")),
    (KernelEventKind.OOM, re.compile(
        r"(?:Memory cgroup )?[Oo]ut of memory(?: \(oom_kill_allocating_task\))?: "
        r"Kill(?:ed)? process \d+ \("
        r"|Killed process \d+ \("
        r"|oom-kill:constraint=CONSTRAINT_\w+,"
        r"|oom_reaper: reaped process \d+ \(")),
    (KernelEventKind.HUNG_TASK, re.compile(r"INFO: task .{1,16}:\d+ blocked for more than \d+ "
                                           r"seconds\.")),
)

# A dmesg/journal prefix in front of the message text: ``<6>``, ``[ 1234.567890] ``,
# ``Dec  2 19:33:42 host kernel: `` or an ISO time ``2026-12-02T19:33:42+0000 host kernel: ``.
_PREFIX = re.compile(
    r"^(?:<\d{1,3}>)?"
    r"(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|"
    r"\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:?\d\d|Z)?)"
    r" \S+ kernel: )?"
    r"(?:\[\s*\d+\.\d+\] ?)?")


def normalise_bus_id(bus: str) -> str:
    """``00000000:3B:00.0`` and ``0000:3b:00`` both become ``0000:3b:00``."""
    bus = bus.lower().split(".")[0]
    domain, _, rest = bus.partition(":")
    return f"{domain[-4:]}:{rest}"


def parse_text(text: str, prefixed: bool = True) -> KernelLine | None:
    """The kernel event a message text is, or None (see the module docstring).

    ``text`` is one message; with ``prefixed`` a dmesg or journal timestamp in front of
    it is skipped (kmsg records have none: :func:`parse_record`). Only the first line
    counts (a kmsg record's dictionary lines follow it, indented).
    """
    text = text.split("\n", 1)[0]
    if prefixed:
        text = text[_PREFIX.match(text).end():]  # type: ignore[union-attr]  # matches ""
    if _USER_NAMED.search(text):
        return None
    m = _XID.match(text)
    if m:
        return KernelLine(KernelEventKind.XID, text, int(m["xid"]),
                          normalise_bus_id(m["bus"]))
    for kind, anchor in _ANCHORS:
        if anchor.match(text):
            return KernelLine(kind, text)
    return None


@dataclass(frozen=True)
class KmsgRecord:
    seq: int
    usec: int | None
    kernel: bool  # logged by the kernel (facility 0), not written to /dev/kmsg by a process
    text: str


def split_record(record: str) -> KmsgRecord | None:
    """A ``/dev/kmsg`` record (``pri,seq,usec,flags[,...];text``), or None if malformed."""
    head, sep, text = record.partition(";")
    parts = head.split(",")
    if not sep or len(parts) < 3:
        return None
    pri, seq, usec = (p.strip() for p in parts[:3])
    if not (pri.isdigit() and seq.isdigit()):
        return None
    return KmsgRecord(int(seq), int(usec) if usec.isdigit() else None,
                      int(pri) >> 3 == 0, text.split("\n", 1)[0])


def parse_record(record: KmsgRecord) -> KernelLine | None:
    """The kernel event in a kmsg record; records not logged by the kernel never count."""
    if not record.kernel:
        return None
    return parse_text(record.text, prefixed=False)
