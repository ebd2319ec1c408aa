"""A controller that answers late (its report loop held up, not its tick) costs no agent
its place: the agent waits on its connection while the controller still passes a
handshake, instead of closing it. The controller takes a closed connection for a dead
process, and only a reconnect within its grace (0.5 s, which a loaded machine misses)
would save the node."""

from __future__ import annotations

import threading
import time

from slurm_robust.launcher.control.controller import Controller
from tests.unit.launcher.test_agents import events, finish, run, wait_for_step

__all__ = ["run"]  # the harness fixture, used by name

#: Longer than the harness's heartbeat timeout (2 s): an agent that gave up at the
#: timeout closes its connection meanwhile.
HOLD_S = 3.5


def test_answers_held_past_the_heartbeat_timeout_lose_no_agent(run):
    # The hang limit above the hold: a stalled report loop delays the steps' news too.
    cfg, parts = run(steps=120, hang_floor_s=30.0)
    ctl: Controller = parts[0]
    loop = ctl._reports
    read, ended = loop._read, loop._on_closed
    held = threading.Event()
    window: list[float] = []
    closed: list[tuple[str, str, float]] = []

    def on_closed(conn, why):
        if conn.view is not None:
            closed.append((conn.view.node, why, time.time()))
        ended(conn, why)

    def held_once(conn, arrivals):
        # The report loop held up before it reads (a starved thread), its tick on time:
        # the controller's own lateness excuses nothing, and every report waits.
        if not held.is_set():
            held.set()
            window.append(time.time())
            time.sleep(HOLD_S)
            window.append(time.time() + 1.0)  # and the answers it then writes
        read(conn, arrivals)

    wait_for_step(cfg, 5)
    loop._on_closed = on_closed
    loop._read = held_once
    result = finish(parts)
    assert held.is_set()
    assert not [c for c in closed if window[0] <= c[2] <= window[1]], (closed, window)
    assert result.status == "completed", result
    evs = events(cfg)
    assert not [e for e in evs if e["event"] == "incident"]
    assert not any(v.lost for v in ctl.agents.values())
