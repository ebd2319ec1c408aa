"""Capture of real local processes (plain Python, no torch): py-spy and faulthandler."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_robust.stacks import procfs
from slurm_robust.stacks.capture import CaptureOptions, capture_local
from slurm_robust.stacks.dumps import read_capture

# A worker that (optionally) installs the stack-dump handler, forks one child, and
# then both wait inside hold_here(); it touches READY once the child exists.
WORKER = """
import os, sys, time
from pathlib import Path
if sys.argv[2]:
    from slurm_robust.stacks.handler import install_stack_dump_handler
    install_stack_dump_handler(sys.argv[2])
def hold_here():
    time.sleep(60)
if os.fork() == 0:
    hold_here()
Path(sys.argv[1]).touch()
hold_here()
"""


@pytest.fixture
def spawn(tmp_path):
    started: list[subprocess.Popen] = []

    def start(template: str = "") -> subprocess.Popen:
        ready = tmp_path / f"ready{len(started)}"
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(ready), template],
                                start_new_session=True)
        started.append(proc)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        time.sleep(0.2)  # both processes reach hold_here
        return proc

    yield start
    for proc in started:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and its child
        proc.wait()


def _frames(dump, role):
    proc = next(p for p in dump.processes if p.role == role)
    assert proc.error is None, proc.message
    return [f.name for f in proc.main_thread().frames]


def test_pyspy_dumps_workers_and_children_and_writes_per_rank_json(spawn, tmp_path):
    a, b = spawn(), spawn()
    out = tmp_path / "cap"
    result = capture_local({0: a.pid, 1: b.pid}, "nodeA", out, capture_id="c1")
    assert result.capture_id == "c1"
    dumps = read_capture(out)
    assert [d.rank for d in dumps] == [0, 1]
    for dump, worker in zip(dumps, (a, b), strict=True):
        assert dump.node == "nodeA" and dump.pid == worker.pid
        roles = sorted(p.role for p in dump.processes)
        assert roles == ["child", "worker"]
        child = next(p for p in dump.processes if p.role == "child")
        assert child.ppid == worker.pid
        assert "hold_here" in _frames(dump, "worker")
        assert "hold_here" in _frames(dump, "child")
        assert all(p.method == "py-spy" for p in dump.processes)
    summary = (out / "node-nodeA.json").read_text()
    assert '"processes": 4' in summary


def test_faulthandler_method_reads_each_process_own_file(spawn, tmp_path):
    template = str(tmp_path / "fh" / "{node}-{pid}.txt")
    a = spawn(template)
    options = CaptureOptions(method="faulthandler", faulthandler_template=template)
    result = capture_local({3: a.pid}, "nodeB", tmp_path / "cap", options)
    (dump,) = result.dumps
    assert all(p.method == "faulthandler" for p in dump.processes)
    assert "hold_here" in _frames(dump, "worker")
    assert "hold_here" in _frames(dump, "child")
    files = sorted(p.name for p in (tmp_path / "fh").iterdir())
    assert len(files) == 2  # parent and forked child write separate files
    # A second capture reads only what the new signal appended.
    again = capture_local({3: a.pid}, "nodeB", tmp_path / "cap2", options).dumps[0]
    assert len(again.processes[0].threads) == len(dump.processes[0].threads)


def test_faulthandler_never_signals_a_process_without_the_handler(spawn, tmp_path):
    a = spawn()  # no handler: SIGUSR2 would kill it
    template = str(tmp_path / "fh" / "{node}-{pid}.txt")
    options = CaptureOptions(method="faulthandler", faulthandler_template=template)
    (dump,) = capture_local({0: a.pid}, "n", tmp_path / "cap", options).dumps
    assert dump.worker.error == "no_handler"
    assert "install_stack_dump_handler" in dump.worker.message
    time.sleep(0.2)
    assert a.poll() is None


def test_auto_falls_back_to_faulthandler_when_pyspy_cannot_run(spawn, tmp_path):
    template = str(tmp_path / "fh" / "{node}-{pid}.txt")
    a = spawn(template)
    options = CaptureOptions(method="auto", pyspy=str(tmp_path / "no-such-py-spy"),
                             faulthandler_template=template)
    (dump,) = capture_local({0: a.pid}, "n", tmp_path / "cap", options).dumps
    assert dump.worker.method == "faulthandler"
    assert "hold_here" in _frames(dump, "worker")
    plain = CaptureOptions(method="py-spy", pyspy=str(tmp_path / "no-such-py-spy"))
    (dump,) = capture_local({0: a.pid}, "n", tmp_path / "cap2", plain).dumps
    assert dump.worker.error == "no_pyspy"


def test_a_process_that_is_gone_is_recorded_not_raised(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (dump,) = capture_local({0: proc.pid}, "n", tmp_path / "cap").dumps
    assert dump.worker.error == "gone"


def test_descendants_include_grandchildren():
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1}
    assert procfs.descendants([10], parents) == {10: [(11, 10), (13, 10), (12, 11)]}
    me = os.getpid()
    assert procfs.read_ppid(me) == os.getppid()
    # Python installs a SIGINT handler, unless started with SIGINT ignored (a background
    # job of a non-interactive shell): install one for the check either way.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert procfs.catches_signal(me, signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert Path(procfs.PROC / str(me)).exists()
