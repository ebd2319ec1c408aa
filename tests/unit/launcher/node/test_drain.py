"""A generation that ends by choice drains its workers (worker_signals.py): the worker's
handler finishes its snapshots before it ends, and the agent waits for that, but only for
workers that handle the signal. Real child processes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from slurm_robust.launcher.node import workers as wk

#: A worker whose drain handler takes 0.5 s (a snapshot's flush), records that it
#: finished, then ends as SIGTERM would: what slurm_robust.train's handler does.
DRAINING = """
import os, signal, sys, time
from slurm_robust.launcher.worker_signals import DRAIN_SIGNAL
def drain(signum, frame):
    time.sleep(0.5)
    open(sys.argv[1], "w").write("flushed")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
signal.signal(DRAIN_SIGNAL, drain)
open(sys.argv[1] + ".ready", "w").close()
while True:
    time.sleep(0.05)
"""


def _worker(tmp_path: Path, code: str, *args: str) -> wk.Worker:
    popen = subprocess.Popen([sys.executable, "-c", code, *args])
    return wk.Worker(0, 0, 0, popen, tmp_path / "log", tmp_path / "progress", time.time())


def _started(marker: Path) -> None:
    deadline = time.monotonic() + 30
    while not Path(str(marker) + ".ready").exists():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.02)


def test_a_drained_worker_finishes_its_snapshot_before_it_ends(tmp_path):
    marker = tmp_path / "flushed"
    w = _worker(tmp_path, DRAINING, str(marker))
    _started(marker)
    wk.stop_workers([w], grace_s=0.1, drain_s=3.0)
    assert marker.read_text() == "flushed"
    assert w.popen.returncode == -15  # it ended as SIGTERM would


def test_without_a_drain_the_stop_does_not_wait_for_the_snapshot(tmp_path):
    marker = tmp_path / "flushed"
    w = _worker(tmp_path, DRAINING, str(marker))
    _started(marker)
    wk.stop_workers([w], grace_s=0.1)
    assert not marker.exists()


def test_a_worker_without_the_handler_is_not_waited_for(tmp_path):
    w = _worker(tmp_path, "import time; time.sleep(60)")
    time.sleep(0.3)
    t0 = time.monotonic()
    wk.stop_workers([w], grace_s=0.1, drain_s=10.0)
    assert time.monotonic() - t0 < 5.0
    assert w.popen.returncode == -15


TRAIN_DRAIN = """
import sys, time
from slurm_robust import train

class SlowFlush:
    def flush(self, timeout):
        time.sleep(0.3)
        open(sys.argv[1], "w").write(f"flushed within {timeout}")

run = train.RobustRun.__new__(train.RobustRun)
run._mgr = SlowFlush()
train._drain(run)
"""


def test_the_training_api_flushes_then_ends_as_sigterm_would(tmp_path):
    marker = tmp_path / "flushed"
    out = subprocess.run([sys.executable, "-c", TRAIN_DRAIN, str(marker)], timeout=120)
    assert out.returncode == -15
    assert marker.read_text().startswith("flushed within")
