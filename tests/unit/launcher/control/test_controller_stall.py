"""A slow controller blames nobody: an agent whose report waits for the controller is
alive, however long the controller takes (liveness counts from a report's arrival)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from slurm_robust.launcher.auth import client_handshake
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.messages import Reply
from slurm_robust.launcher.protocol import Channel
from tests.unit.launcher.control.controller_helpers import stall_tick_once, wait_running
from tests.unit.launcher.test_agents import run  # noqa: F401 - the fixture, by name

HEARTBEAT_TIMEOUT_S = 1.0
STALL_S = 3.0


def _agent_loop(ctl: Controller, index: int, stop: threading.Event,
                errors: list[BaseException], named: bool) -> None:
    try:
        info = json.loads(ctl.paths.controller.read_text())
        chan = Channel.connect(info["host"], info["port"], 30.0)
        client_handshake(chan, ctl.secret)
        gen, held = -1, None
        while not stop.is_set():
            report = {"op": "report", "key": ctl.ident.step_key, "agent": index,
                      "node": f"n{index + 1}", "pid": 100 + index, "gen": gen,
                      "time": time.time(), "exits": [], "progress": [], "states": {},
                      "stacks": {}}
            if named and held is not None:
                report["plan_id"] = held[0]
            reply = Reply.from_json(chan.request(report))
            if reply.unchanged:
                assert held is not None and reply.plan_id == held[0], (reply, held)
                plan = held[1]
            else:
                plan = reply.plan
                held = (reply.plan_id, plan) if plan is not None else None
            gen = plan.gen if plan is not None and plan.gen is not None else gen
            time.sleep(0.1)
        chan.close()
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize("named", [False, True], ids=["full-plans", "unchanged-replies"])
def test_a_stalled_controller_declares_no_agent_lost(start_controller, monkeypatch, named):
    # named: the agents name the plan they hold, so most answers are "unchanged".
    ctl = start_controller(HEARTBEAT_TIMEOUT_S)
    stop, errors = threading.Event(), []
    agents = [threading.Thread(target=_agent_loop, args=(ctl, i, stop, errors, named),
                               daemon=True) for i in range(2)]
    for t in agents:
        t.start()
    try:
        wait_running(ctl)
        time.sleep(0.5)  # both agents are reporting on the running generation
        lost: list[int] = []
        real_lost = ctl.recovery.on_agent_lost
        monkeypatch.setattr(ctl.recovery, "on_agent_lost",
                            lambda m, closed, now: (lost.append(m.index),
                                                    real_lost(m, closed, now)))
        real_report = ctl.recovery.on_report
        stalled = threading.Event()

        def slow_report(member, *args, **kwargs) -> None:
            # Once: processing one report stops the controller for STALL_S under its
            # lock (a slow state.json write on a loaded file system, a long GC pause),
            # and the tick loop is the next to take the lock, before the reports that
            # queued up meanwhile: what a loaded controller does at scale.
            real_report(member, *args, **kwargs)
            if not stalled.is_set():
                stalled.set()
                time.sleep(STALL_S)
                ctl.tick(time.time())

        monkeypatch.setattr(ctl.recovery, "on_report", slow_report)
        while not stalled.is_set():
            time.sleep(0.01)
        time.sleep(STALL_S + 1.5)  # the stall and a few ticks after it
        assert not errors, errors
        assert lost == [], f"agents {lost} declared lost while the controller stalled"
        assert not any(v.lost for v in ctl.agents.values())
    finally:
        stop.set()
        for t in agents:
            t.join(timeout=10)


def test_a_report_still_in_the_socket_counts_as_waiting():
    import socket

    a, b = socket.socketpair()
    server, agent = Channel(a, 5.0), Channel(b, 5.0)
    assert not server.has_input()
    agent.send({"op": "report"})
    deadline = time.monotonic() + 5
    while not server.has_input() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.has_input()
    assert server.recv() == {"op": "report"} and not server.has_input()
    agent.close()
    assert server.has_input()  # the peer's close is input too: the closed path sees it
    server.close()
    assert not server.has_input()


# ---------------------------------------------------------------------- real agents
def test_a_stalled_tick_with_real_agents_evicts_nobody_and_requeues_nothing(run,  # noqa: F811
                                                                            monkeypatch):
    """Real agents (node/agent.py, tiny real workers, a spare parked): one tick of the
    controller holds its lock for three heartbeat timeouts. The agents give up waiting
    for their answers, their connections close, their handshakes are refused and they
    look for another controller; the controller's lease is what tells them it lives. No
    node may be declared lost, no successor take over, nothing be requeued; the run goes
    on and completes, and the overload is recorded."""
    from tests.unit.launcher.test_agents import events, finish, wait_for_step

    cfg, parts = run(steps=200, spares=1)
    ctl = parts[0]
    wait_for_step(cfg, 5)
    stall = 3 * cfg.heartbeat_timeout_s
    # Under the controller's lock: no answer, no handshake.
    stalled = stall_tick_once(monkeypatch, ctl, stall)
    result = finish(parts, timeout=120)
    assert stalled.is_set()
    evs = events(cfg)
    assert [e for e in evs if e["event"] == "incident"] == []
    assert [e for e in evs if e["event"] == "controller"] == []  # no takeover
    assert result.status == "completed", result
    assert not any(v.lost for v in ctl.agents.values())
    # The stall's record (a loaded test machine may add its own, shorter lateness).
    overloads = [e for e in evs if e["event"] == "controller_overload"]
    assert max(e["lag_s"] for e in overloads) >= stall - 1.0, overloads
    from slurm_robust.launcher.control.state import load_state
    state = load_state(ctl.paths.state)
    assert state.requeues == 0 and state.term == 1 and state.blamed == []
