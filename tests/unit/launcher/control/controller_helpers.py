"""Helpers of the tests that run a real controller in-process (start_controller, the
agent-run fixture): wait for its running phase, stall its tick once."""

from __future__ import annotations

import threading
import time

import pytest

from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.enums import Phase


def wait_running(ctl: Controller, timeout_s: float = 20.0) -> None:
    """Return once the controller's run is in its running phase (fail after
    ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while ctl.recovery.phase is not Phase.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ctl.recovery.phase is Phase.RUNNING


def stall_tick_once(monkeypatch: pytest.MonkeyPatch, ctl: Controller,
                    stall_s: float) -> threading.Event:
    """Make the controller's next tick hold its lock ``stall_s`` seconds after its work
    (no answer, no handshake meanwhile); the event is set when that tick starts its
    stall."""
    real_tick = ctl.recovery.tick
    stalled = threading.Event()

    def slow_tick(now: float) -> None:
        real_tick(now)
        if not stalled.is_set():
            stalled.set()
            time.sleep(stall_s)  # under the controller's lock

    monkeypatch.setattr(ctl.recovery, "tick", slow_tick)
    return stalled
