"""Kernel-log lines a user can write text into never become events.

A local user chooses their process name (comm) and the names of the files they map; the
kernel prints both verbatim in ``segfault at`` and ``traps:`` lines. The three consumers
(the GPU check's Xid source, which drains; the in-job monitor, whose fatal finding
evicts; the classifier, whose infrastructure class evicts) must see nothing in them,
whatever the names say, and must still see the genuine kernel lines.
"""

from __future__ import annotations

import signal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_robust.health.kernel_formats import KernelEventKind, parse_text
from slurm_robust.health.kernlog import scan
from slurm_robust.health.nvml import parse_kmsg_xids
from slurm_robust.launcher.classify import Evidence, classify

TB = 'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'

# Genuine kernel lines, as real kernels and the NVIDIA driver print them.
GENUINE: dict[str, KernelEventKind | None] = {
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=2934, name=python, GPU has fallen off the bus.":
        KernelEventKind.XID,
    "NVRM: Xid (PCI:0000:86:00): 94, pid=1187, name=pt_main_thread, Contained: SM (0x1). "
    "RST: No, D-RST: No": KernelEventKind.XID,
    "NVRM: Xid (0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected":
        KernelEventKind.XID,
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.": KernelEventKind.GPU_LOST,
    "NVRM: GPU at PCI:0000:3b:00: GPU-5ad1d7c1-2f61-44e9-8e5c-19c4ab7f2e5f":
        None,  # informational, no event
    "NVRM: RmInitAdapter failed! (0x26:0x56:1474)": KernelEventKind.GPU_LOST,
    "Kernel panic - not syncing: Fatal exception in interrupt": KernelEventKind.PANIC,
    "BUG: unable to handle page fault for address: ffffffffc0a1b2c3": KernelEventKind.PANIC,
    "BUG: kernel NULL pointer dereference, address: 0000000000000008":
        KernelEventKind.PANIC,
    "kernel BUG at mm/slub.c:4204!": KernelEventKind.PANIC,
    "Oops: 0002 [#1] PREEMPT SMP NOPTI": KernelEventKind.PANIC,
    "general protection fault, probably for non-canonical address 0xdead000000000100: "
    "0000 [#1] SMP PTI": KernelEventKind.PANIC,
    "NMI watchdog: Watchdog detected hard LOCKUP on cpu 17": KernelEventKind.PANIC,
    "mce: [Hardware Error]: Machine check events logged": KernelEventKind.PANIC,
    "I/O error, dev nvme0n1, sector 1953525168 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio "
    "class 2": KernelEventKind.IO_ERROR,
    "blk_update_request: I/O error, dev sdb, sector 2048 op 0x0:(READ) flags 0x0 "
    "phys_seg 1 prio class 0": KernelEventKind.IO_ERROR,
    "Buffer I/O error on dev sdb1, logical block 0, async page read": KernelEventKind.IO_ERROR,
    "EXT4-fs error (device nvme0n1p2): ext4_find_entry:1455: inode #2: comm python: "
    "reading directory lblock 0": KernelEventKind.IO_ERROR,
    "EXT4-fs (sda1): Remounting filesystem read-only": KernelEventKind.IO_ERROR,
    "XFS (dm-0): metadata I/O error in \"xfs_trans_read_buf_map\" at daddr 0x2 len 1 error 5":
        KernelEventKind.IO_ERROR,
    "XFS (sdc): Corruption detected. Unmount and run xfs_repair": KernelEventKind.IO_ERROR,
    "Out of memory: Killed process 4242 (python) total-vm:83341012kB, anon-rss:61125084kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:121112kB oom_score_adj:0":
        KernelEventKind.OOM,
    "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB":
        KernelEventKind.OOM,
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,"
    "oom_memcg=/slurm/uid_1000/job_77,task=python,pid=4242,uid=1000": KernelEventKind.OOM,
    "INFO: task python:4242 blocked for more than 122 seconds.": KernelEventKind.HUNG_TASK,
}

# Text of every pattern a consumer ever matched, and of every genuine line.
NEEDLES = sorted(set(GENUINE) | {
    "NVRM: Xid (PCI:0000:3b:00): 79", "Xid 79", "Xid (PCI:0000:3b:00): 48", "Xid 94",
    "Kernel panic", "Kernel panic - not syncing: ", "BUG: unable to handle", "kernel BUG at",
    "Oops: ", "hard LOCKUP", "general protection fault", "Machine check events logged",
    "mce: [Hardware Error]", "Out of memory: Killed process", "oom-kill:", "invoked oom-killer",
    "I/O error", "Buffer I/O error", "EXT4-fs error", "XFS (sda): error shutdown",
    "Remounting filesystem read-only", "I/O error, dev sda, sector 1", "fallen off the bus",
    "GPU is lost", "RmInitAdapter failed", "probe routine failed", "Call Trace:",
    "RIP: 0010:", "schedule+0x2d/0x90", "caused by previous Xid 79", "INFO: task ",
    "[ 1234.567890] ", "<0>", "Dec  2 19:33:42 node7 kernel: ", "traps: ", "segfault at ",
})

PREFIXES = ("", "[ 8841.097530] ", "<6>[ 8841.097530] ", "Dec  2 19:33:42 node7 kernel: ",
            "2026-12-02T19:33:42.097530+00:00 node7 kernel: [ 8841.097530] ",
            # journalctl -o short-precise
            "Mar 13 11:01:55.594839 node7 kernel: ")

_name = st.text(max_size=12)
_hex = st.integers(min_value=0, max_value=2**48)


def _as_comm(name: str) -> str:
    """``name`` as the kernel stores a process name: its first 15 bytes (a character cut
    in two is dropped)."""
    return name.encode()[:15].decode("utf-8", "ignore")


@st.composite
def hostile_name(draw: st.DrawFn) -> str:
    """A name with a pattern's text at the start, in the middle or at the end."""
    return draw(_name) + draw(st.sampled_from(NEEDLES)) + draw(_name)


@st.composite
def user_named_line(draw: st.DrawFn) -> str:
    """A segfault or traps line with user-chosen comm and file names."""
    # The kernel keeps at most TASK_COMM_LEN - 1 = 15 bytes of a process name: a comm
    # that is a whole Xid line cannot exist (hypothesis found one that could only match
    # because it was 90 characters long). File names have no such limit.
    comm = draw(st.one_of(hostile_name(), _name.filter(bool)).map(_as_comm).filter(bool))
    path = draw(st.one_of(hostile_name(), _name.filter(bool)))
    pid, ip, sp, base = draw(st.integers(1, 4_194_304)), draw(_hex), draw(_hex), draw(_hex)
    templates = (
        f"{comm}[{pid}]: segfault at {draw(_hex):x} ip {ip:016x} sp {sp:016x} error 4 in "
        f"{path}[{base:x}+1f000] likely on CPU 3 (core 3, socket 0)",
        f"{comm}[{pid}]: segfault at 0 ip {ip:016x} sp {sp:016x} error 6",
        f"traps: {comm}[{pid}] general protection fault ip:{ip:x} sp:{sp:x} error:0 in "
        f"{path}[{base:x}+1f000]",
        f"traps: {comm}[{pid}] trap divide error ip:{ip:x} sp:{sp:x} error:0 in "
        f"{path}[{base:x}+2000]",
        f"traps: {comm}[{pid}] trap invalid opcode ip:{ip:x} sp:{sp:x} error:0",
    )
    return draw(st.sampled_from(templates))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(user_named_line(), min_size=1, max_size=4),
       prefix=st.sampled_from(PREFIXES))
def test_user_chosen_names_never_become_kernel_events(lines: list[str], prefix: str) -> None:
    records = [f"{pri},{seq},{seq * 1000},-;{line}"
               for seq, line in enumerate(lines, start=10) for pri in (4, 6)]
    # The GPU check's Xid source (root; an Xid drains the node).
    assert parse_kmsg_xids(records, -1)[0] == []
    # The in-job monitor (a fatal finding evicts the node).
    assert scan(records, -1)[0] == []
    dmesg = [prefix + line for line in lines]
    assert [parse_text(line) for line in dmesg] == [None] * len(dmesg)
    # The classifier: the kernel lines change nothing about the worker's own failure.
    for ev in (Evidence(exit_code=1, log_tail=TB + "KeyError: 'labels'"),
               Evidence(signal=signal.SIGKILL), Evidence(signal=signal.SIGSEGV)):
        plain = classify(ev)
        with_kernel = classify(Evidence(exit_code=ev.exit_code, signal=ev.signal,
                                        log_tail=ev.log_tail, kernel_log=dmesg))
        assert (with_kernel.cls, with_kernel.side, with_kernel.action, with_kernel.source) \
            == (plain.cls, plain.side, plain.action, plain.source)


def test_a_user_space_general_protection_fault_is_not_a_panic() -> None:
    """What any program's bad pointer prints: no crafting needed."""
    line = ("traps: python3[48122] general protection fault ip:7f0c5b2e1a4d "
            "sp:7ffd2c41a0f0 error:0 in libc.so.6[7f0c5b28d000+195000]")
    assert scan([f"6,5,100,-;{line}"], -1)[0] == []
    c = classify(Evidence(signal=signal.SIGSEGV, kernel_log=[line]))
    assert c.cls == "worker_signal" and not c.evicts


def test_a_process_named_like_an_xid_does_not_drain_or_evict() -> None:
    line = ("NVRM: Xid (PCI:[3121]: segfault at 0 ip 000055d1c2a4b1d0 sp 00007ffc9f4e3a70 "
            "error 4 in Xid 79: GPU has fallen off the bus[55d1c2a00000+5000]")
    assert parse_kmsg_xids([f"6,9,1,-;{line}"], -1) == ([], 9)
    c = classify(Evidence(exit_code=1, log_tail=TB + "KeyError: 'x'", kernel_log=[line]))
    assert c.cls == "user_exception" and c.side == "user"


def test_a_hung_task_report_is_not_a_panic() -> None:
    records = ["3,20,1,-;INFO: task python:4242 blocked for more than 122 seconds.",
               "3,21,1,-;      Not tainted 6.8.0-45-generic #45-Ubuntu",
               "3,22,1,-;Call Trace:", "4,23,1,-; <TASK>",
               "4,24,1,-; __schedule+0x27c/0x6b0", "4,25,1,-; io_schedule+0x46/0x80"]
    events, _ = scan(records, -1)
    assert [e.kind for e in events] == [KernelEventKind.HUNG_TASK]
    c = classify(Evidence(exit_code=1, kernel_log=[r.split(";", 1)[1] for r in records]))
    assert c.cls != "kernel_panic" and "kernel_hung_task" in c.evidence


def test_a_line_written_to_kmsg_from_user_space_does_not_count() -> None:
    """Writes to /dev/kmsg are logged with a user facility (pri >= 8) whatever they ask."""
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus."
    assert parse_kmsg_xids([f"12,3,1,-;{line}"], -1) == ([], 3)
    assert parse_kmsg_xids([f"4,3,1,-;{line}"], -1) == ([("0000:3b:00", 79)], 3)


def test_genuine_kernel_lines_are_recognised() -> None:
    for line, kind in GENUINE.items():
        for prefix in PREFIXES:
            found = parse_text(prefix + line)
            assert (found.kind if found else None) == kind, prefix + line
        events, _ = scan([f"3,1,1,-;{line}"], -1)
        assert [e.kind for e in events] == ([kind] if kind else []), line


def test_genuine_kernel_lines_still_classify() -> None:
    def cls(line: str, sig: int | None = None) -> tuple[str, str]:
        c = classify(Evidence(exit_code=None if sig else 1, signal=sig,
                              kernel_log=["[ 8841.097530] " + line]))
        return c.cls, c.action
    assert cls("NVRM: Xid (PCI:0000:3b:00): 79, pid=2934, name=python, GPU has fallen off "
               "the bus.") == ("gpu_unavailable", "evict")
    assert cls("NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python, An uncorrectable double "
               "bit error") == ("gpu_memory_error", "evict")
    assert cls("NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.")[0] == "gpu_unavailable"
    assert cls("Kernel panic - not syncing: Fatal exception")[0] == "kernel_panic"
    assert cls("BUG: kernel NULL pointer dereference, address: 0000000000000008")[0] == \
        "kernel_panic"
    assert cls("Buffer I/O error on dev sdb1, logical block 0, async page read")[0] == \
        "disk_fault"
    assert cls("Out of memory: Killed process 4242 (python) total-vm:1kB",
               signal.SIGKILL)[0] == "cpu_oom"
    assert parse_kmsg_xids(["4,7,1,-;NVRM: Xid (PCI:0000:86:00): 94, pid=1187, "
                            "name=pt_main_thread, Contained: SM (0x1)."], 0) == \
        ([("0000:86:00", 94)], 7)
