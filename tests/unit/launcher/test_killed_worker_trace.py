"""The killed-worker path in docs/ARCHITECTURE.md is the one the code takes.

A real controller and real agents (threads) run tiny real workers (test_agents.py's
harness); cProfile on every thread counts the calls into launcher files from the moment a
worker is killed until its incident is resolved (the restarted ranks' first step), and
over fault-free stretches before and after it (what runs anyway). Every file entered only on the
failure's path must be named in the doc's section, and every numbered step's file must
be in the trace: the doc can neither hide a file the path enters nor keep a step the code
no longer takes.
"""

from __future__ import annotations

import cProfile
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import slurm_robust.launcher
from tests.unit.launcher.test_agents import events, finish, run, wait_for_step, worker_pid
from tests.unit.launcher.test_architecture_doc import section

LAUNCHER = Path(slurm_robust.launcher.__file__).parent
#: A fault-free stretch of the same run: what runs anyway (heartbeats, the node monitor,
#: the controller's lease, metrics) and is not the failure's path.
QUIET_S = 2.0
__all__ = ["run"]  # the harness fixture, used by name


class LauncherTrace:
    """Calls into launcher files on every thread started while it is active, counted by
    cProfile (a C hook: a Python profile function slowed the harness past its
    handshake deadline). ``snapshot`` reads every thread's counts; two snapshots' difference
    is what ran between them."""

    def __init__(self) -> None:
        self.profilers: list[cProfile.Profile] = []
        self._prefix = str(LAUNCHER) + os.sep

    def _start_thread(self, frame: FrameType, event: str, arg: Any) -> None:
        prof = cProfile.Profile()
        self.profilers.append(prof)
        prof.enable()  # replaces this hook in this thread

    def __enter__(self) -> LauncherTrace:
        threading.setprofile(self._start_thread)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]

    def snapshot(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for prof in list(self.profilers):
            for entry in prof.getstats():
                code = entry.code
                if not isinstance(code, str) and code.co_filename.startswith(self._prefix):
                    counts[code.co_filename[len(self._prefix):]] += entry.callcount
        return counts


def doc_files() -> tuple[list[str], set[str]]:
    """The numbered steps' files, and every launcher file the section names: a path
    (``launcher/control/plans.py``, ``node/evidence.py``, ``plans.py``) or a module-qualified
    name in backticks (``run_facts.failure_incident``), resolved against the launcher."""
    text = section("killed-worker-path")
    steps = re.findall(r"^\d+\. `launcher/([\w/]+\.py)`", text, re.M)
    files = {str(p.relative_to(LAUNCHER)) for p in LAUNCHER.rglob("*.py")}
    by_stem: dict[str, set[str]] = {}
    for rel in files:
        by_stem.setdefault(Path(rel).stem, set()).add(rel)
    named: set[str] = set()
    for token in re.findall(r"[\w/]+\.py\b", text):
        rel = token.removeprefix("launcher/")
        named.update({rel} & files or by_stem.get(Path(rel).stem, set()))
    for stem in re.findall(r"`([a-z_]+)\.[a-z_]+", text):
        named.update(by_stem.get(stem, set()))
    return steps, named


def test_the_killed_worker_path_is_the_traced_one(run):
    # Hooked before the harness starts its threads (Python 3.11 has no hook for
    # threads that already run); counted from the kill to the incident's resolution.
    with LauncherTrace() as trace:
        cfg, parts = run(steps=200)
        wait_for_step(cfg, 5)
        pid = worker_pid(cfg, 1)
        quiet = trace.snapshot()
        time.sleep(QUIET_S)
        before = trace.snapshot()
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 60
        while not [e for e in events(cfg) if e["event"] == "incident"]:
            assert time.time() < deadline, "the incident was never resolved"
            time.sleep(0.01)
        after = trace.snapshot()
        time.sleep(QUIET_S)
        later = trace.snapshot()
        result = finish(parts)
    assert result.status == "completed"
    [inc] = [e for e in events(cfg) if e["event"] == "incident"]
    assert inc["rung"] == "in_place"
    traced = {f for f, n in after.items() if n > before.get(f, 0)}
    background = {f for f, n in before.items() if n > quiet.get(f, 0)} | \
        {f for f, n in later.items() if n > after.get(f, 0)}
    path = traced - background
    steps, named = doc_files()
    assert set(steps) <= traced, f"steps the code did not take: {set(steps) - traced}"
    assert path <= named, f"files the failure's path enters that the doc does not name: " \
                          f"{sorted(path - named)} (traced: {sorted(traced)})"
