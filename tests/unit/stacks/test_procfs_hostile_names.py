"""/proc readers against a process that names itself in bytes that are not UTF-8.

Any user can do it (``prctl(PR_SET_NAME)``; the multi-user security test's second user
does), and everything that scans /proc on a node (stack capture, the worker watch, the
break-fix loop's slurmd identity, the mini-cluster's own process scan) must read past it.
A real process, not a fabricated /proc file: the kernel decides what the files hold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_robust.health.repair import boot_identity
from slurm_robust.launcher.node.workers import process_state
from slurm_robust.stacks import procfs
from slurm_robust_rehearsal.cluster.daemons import is_ours, our_processes

NAMER = textwrap.dedent("""
    import ctypes, signal, sys, time
    signal.signal(signal.SIGUSR2, lambda *_: None)
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"\\xff\\xfe-odd) (\\xc3"), 0, 0, 0)
    print("named", flush=True)
    time.sleep(60)
""")


@pytest.fixture
def oddly_named() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", NAMER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "named"
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_its_stat_is_not_utf8(oddly_named: int):
    with pytest.raises(UnicodeDecodeError):
        Path(f"/proc/{oddly_named}/stat").read_text(encoding="utf-8")


def test_every_reader_reads_past_it(oddly_named: int, tmp_path: Path):
    comm, fields = procfs.read_stat(oddly_named)
    assert comm == "\ufffd\ufffd-odd) (\ufffd"  # its spaces and parentheses kept
    assert fields[0] in "RS" and int(fields[1]) == os.getpid()
    assert procfs.read_ppid(oddly_named) == os.getpid()
    assert procfs.ppid_map()[oddly_named] == os.getpid()
    assert oddly_named in [p for p, _ in procfs.descendants([os.getpid()])[os.getpid()]]
    assert procfs.catches_signal(oddly_named, signal.SIGUSR2)
    assert process_state(oddly_named) in ("R", "S")
    assert boot_identity(oddly_named).endswith(":no-slurmd")
    assert not is_ours(oddly_named, tmp_path)
    assert oddly_named not in our_processes(tmp_path)
