"""``bench scale``'s stress: a controller made slow on purpose.

Two ways, alone or together, during the steady window:

- ``--stall-tick-s S``: one tick of the controller holds its lock for S seconds (a slow
  ``state.json`` write, a GC pause): the parent signals the controller process
  (SIGUSR1) at ``--stall-at`` of the window, and its next tick sleeps under the lock.
- ``--cpu-hog N``: N busy processes beside the controller for the whole window.

The simulated agents give up on an answer outstanding ``--agent-timeout-s`` as real
agents do (close, reconnect, handshake), so a stall also exercises the closed path.

Either must show as latency and as the controller's recorded overload (its log, the
``controller_overload`` events, control/overload.py), never as an agent declared lost.
The worst lag is read from the controller's live metrics: its log and events record at
most one overload every 10 s, so an episode after an earlier one (a slow start on a
loaded machine) is held there past the end of a short window.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from slurm_robust.launcher.control.metrics import METRICS_FILE

#: The signal that asks the controller process for one stalled tick.
STALL_SIGNAL = signal.SIGUSR1
#: What the controller process logs as its tick stalls (counted in the summary).
STALL_LINE = "bench: a tick stalls under the controller's lock for"
#: The controller's metric that holds its worst lateness in one gap (control/metrics.py).
LAG_MAX_METRIC = "slurm_robust_controller_lag_max_seconds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stall-tick-s", type=float, default=0.0,
                        help="stall one controller tick this long, under its lock (0: none)")
    parser.add_argument("--stall-at", type=float, default=0.5,
                        help="when in the steady window the stall starts (0.5: halfway)")
    parser.add_argument("--cpu-hog", type=int, default=0,
                        help="busy processes beside the controller in the window (0)")
    parser.add_argument("--agent-timeout-s", type=float, default=0.0,
                        help="a simulated agent whose answer is outstanding this long "
                             "closes its connection and reconnects (0: the heartbeat "
                             "timeout, as this tree's agents; 2 for agents before they "
                             "waited out a late controller)")


def arm_stall(ctl: Any, stall_s: float) -> None:
    """In the controller process: the next tick after STALL_SIGNAL sleeps ``stall_s``
    under the controller's lock (the tick loop holds it)."""
    if stall_s <= 0:
        return
    asked = threading.Event()
    real_tick = ctl.recovery.tick

    def tick(now: float) -> None:
        real_tick(now)
        if asked.is_set():
            asked.clear()
            logging.getLogger(__name__).warning("%s %.1f s", STALL_LINE, stall_s)
            time.sleep(stall_s)

    ctl.recovery.tick = tick
    signal.signal(STALL_SIGNAL, lambda *_: asked.set())


def wait_for(ctl: Any) -> None:
    """Join the controller in short waits, so the main thread runs the signal handler."""
    while ctl.alive():
        time.sleep(0.1)
    ctl.join()


class Stress:
    """The parent's side: the hogs and the stall signal, at their moments."""

    def __init__(self, args: argparse.Namespace, controller_pid: int) -> None:
        self.args, self.pid = args, controller_pid
        self.hogs: list[subprocess.Popen[bytes]] = []
        self.stalled_at: float | None = None

    def start(self, window_start: float, fail_at: float) -> None:
        for _ in range(max(self.args.cpu_hog, 0)):
            self.hogs.append(subprocess.Popen(
                [sys.executable, "-c", "while True: pass"]))
        if self.args.stall_tick_s > 0:
            at = window_start + self.args.stall_at * (fail_at - window_start)

            def fire() -> None:
                time.sleep(max(at - time.time(), 0.0))
                self.stalled_at = time.time()
                os.kill(self.pid, STALL_SIGNAL)

            threading.Thread(target=fire, daemon=True).start()

    def stop(self) -> None:
        for hog in self.hogs:
            hog.kill()
            hog.wait()
        self.hogs = []

    def summary(self, run_dir: Path, ctl_log: Path, window_start: float) -> dict[str, Any]:
        """What was done, and the overload the controller recorded (events, log)."""
        lines = ctl_log.read_text(errors="replace").splitlines() if ctl_log.exists() else []
        warned = [line for line in lines if "controller overloaded" in line]
        records = []
        events = run_dir / "events.jsonl"
        if events.exists():
            for line in events.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "controller_overload":
                    records.append(rec)
        return {"stall_tick_s": self.args.stall_tick_s,
                "stalled_at_s": None if self.stalled_at is None
                else round(self.stalled_at - window_start, 2),
                "stalls": sum(STALL_LINE in line for line in lines),
                "cpu_hog": self.args.cpu_hog,
                "overload_warnings": len(warned),
                "overload_first_warning": warned[0][:300] if warned else None,
                "overload_events": len(records),
                "overload_event_lag_max_s": max((r["lag_s"] for r in records),
                                                default=None),
                "overload_lag_max_s": lag_max_from_metrics(run_dir),
                "overload_episodes": sum(r["episodes"] for r in records),
                "overload_late_s": round(sum(r["late_s"] for r in records), 3)}


def lag_max_from_metrics(run_dir: Path, timeout_s: float = 5.0) -> float | None:
    """The controller's worst lateness so far, scraped from its metrics endpoint (None:
    the controller has exited or serves none)."""
    try:
        target = json.loads((run_dir / METRICS_FILE).read_text())
        url = f"http://{target['host']}:{target['port']}{target['path']}"
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own endpoint
            body = resp.read().decode()
    except (OSError, ValueError, KeyError):
        return None
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == LAG_MAX_METRIC:
                return round(sample.value, 3)
    return None
