"""A check that raises is a check-program error, never a drain; /proc is decoded
defensively."""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import time
from pathlib import Path

from slurm_robust.health import Probes, Status, run_suite
from slurm_robust.health.probes import _processes, _unescape_mount
from slurm_robust.site_config import SiteConfig

_NAME = b"\xff\xfe-stray\xc3"


def _child_with_bad_name() -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(_NAME), 0, 0, 0)  # PR_SET_NAME
        time.sleep(30)
        os._exit(0)
    for _ in range(200):
        comm = Path(f"/proc/{pid}/comm").read_bytes()
        if comm.startswith(b"\xff"):
            break
        time.sleep(0.01)
    return pid


def test_a_process_name_that_is_not_utf8_does_not_crash_the_probe():
    pid = _child_with_bad_name()
    try:
        procs = {p["pid"]: p for p in _processes()}
        assert "\ufffd" in procs[pid]["comm"] and "-stray" in procs[pid]["comm"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_mount_paths_are_unescaped_and_decoded_with_replacement():
    assert _unescape_mount(b"/mnt/a\\040b") == "/mnt/a b"
    assert _unescape_mount(b"/mnt/\\377x") == "/mnt/\ufffdx"


def test_a_raising_check_is_an_error_and_does_not_fail_the_suite(tmp_path):
    # A process table the real check cannot read (a record without uid) makes it raise.
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True)
    result = run_suite("prolog", "n1", job="7", config=cfg,
                       probes=Probes({"processes": [{"pid": 1, "comm": "x"}]}), journal=True)
    by = {r.check: r for r in result.results}
    assert by["host_stray_procs"].status is Status.ERROR
    assert "check program error KeyError" in by["host_stray_procs"].reason
    assert result.passed and result.reason == ""
    assert result.to_dict()["check_errors"] == 1
    journal = result.journal.read_text()
    assert '"status":"error"' in journal.replace(" ", "")


def test_a_reader_holding_a_lock_on_the_journal_does_not_stall_the_suite(tmp_path):
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True)
    journal = tmp_path / "n1" / "health" / "n1.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b"")
    holder = open(journal, "rb")  # what any user can do to a world-readable file
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        t0 = time.monotonic()
        result = run_suite("prolog", "n1", job="7", config=cfg, probes=Probes({}))
        assert time.monotonic() - t0 < 1.5
        assert result.journal == journal
        assert len(journal.read_text().splitlines()) == len(result.results)
    finally:
        holder.close()


def test_a_planted_symlink_journal_is_refused_without_failing_the_suite(tmp_path):
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True)
    target = tmp_path / "target"
    target.write_bytes(b"")
    journal = tmp_path / "n1" / "health" / "n1.jsonl"
    journal.parent.mkdir(parents=True)
    journal.symlink_to(target)
    result = run_suite("prolog", "n1", job="7", config=cfg, probes=Probes({}))
    assert result.journal is None and target.read_bytes() == b""
