"""The controller's wake-up (protocol.py): an empty line that makes a waiting agent
report at once when its plan changed, instead of at its next heartbeat.

Real sockets, a real controller and real child processes; the bounds are loose on
purpose (a wake-up that did not arrive would leave the wait to its 30 s timeout)."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_robust.launcher.auth import client_handshake
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.node import workers as wk
from slurm_robust.launcher.protocol import Channel, ChannelClosed


def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    agent = Channel(b, 5.0)
    agent.wakeups = True  # as Channel.connect makes the agent's end
    return Channel(a, 5.0), agent


def test_a_reply_skips_wake_ups_and_they_are_seen_between_messages():
    server, agent = _pair()
    assert server.wake()
    server.send({"plan": {"gen": 1}})
    assert agent.recv() == {"plan": {"gen": 1}}  # the wake-up before it is skipped
    assert not agent.woken()
    server.send({"plan": {"gen": 2}})
    assert server.wake() and server.wake()
    assert agent.recv() == {"plan": {"gen": 2}}
    # Read in with the reply: waiting in the buffer, seen once.
    assert agent.woken() and not agent.woken()
    assert server.wake()
    # Unread on the socket: the agent's wait sees it readable.
    assert select.select([agent.fileno()], [], [], 1.0)[0]


def test_a_wake_up_never_lands_inside_a_message_being_sent():
    server, _ = _pair()
    with server._send_lock:  # another thread is writing a reply
        assert server.wake() is False


def test_a_wake_up_to_a_peer_that_does_not_read_never_blocks():
    server, agent = _pair()
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sent = 0
    t0 = time.monotonic()
    while server.wake() and sent < 10_000_000:
        sent += 1
    assert time.monotonic() - t0 < 5.0 and sent < 10_000_000  # refused once full
    agent.sock.close()


def test_the_agent_wait_ends_on_a_wake_up(tmp_path: Path):
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    w = wk.Worker(0, 0, 0, popen, tmp_path / "log", tmp_path / "progress", time.time())
    server, agent = _pair()
    try:
        t0 = time.monotonic()
        wk.wait_for_exit([w], 0.3, wake_fd=agent.fileno())
        assert time.monotonic() - t0 >= 0.3  # nothing to wake it: the full wait
        assert server.wake()
        t0 = time.monotonic()
        wk.wait_for_exit([w], 30.0, wake_fd=agent.fileno())
        assert time.monotonic() - t0 < 10.0
        t0 = time.monotonic()
        wk.wait_for_exit([], 30.0, wake_fd=agent.fileno())  # a spare has no workers
        assert time.monotonic() - t0 < 10.0
    finally:
        popen.kill()
        popen.wait()


@pytest.fixture
def controller(start_controller):
    return start_controller(30.0)


def _agent(ctl: Controller, index: int) -> Channel:
    info = json.loads(ctl.paths.controller.read_text())
    chan = Channel.connect(info["host"], info["port"], 5.0)
    client_handshake(chan, ctl.secret)
    return chan


def _report(ctl: Controller, index: int) -> dict:
    return {"op": "report", "key": ctl.ident.step_key, "agent": index, "node": f"n{index + 1}",
            "pid": 100 + index, "gen": -1, "time": time.time(), "exits": [], "progress": [],
            "states": {}, "stacks": {}}


def test_the_controller_wakes_an_agent_whose_plan_changed(controller):
    first, second = _agent(controller, 0), _agent(controller, 1)
    assert first.request(_report(controller, 0))["plan"] == {}  # gathering: no plan yet
    second.request(_report(controller, 1))
    # The generation starts in the controller's tick: the first agent, which has not
    # asked since, is woken, not left to its heartbeat (30 s here, as a stand-in).
    t0 = time.monotonic()
    assert select.select([first.fileno()], [], [], 10.0)[0]
    assert time.monotonic() - t0 < 10.0
    first._buf += first.sock.recv(64)
    assert first.woken()
    plan = first.request(_report(controller, 0))["plan"]
    assert plan["gen"] == 1 and plan["role"] == "active" and plan["ranks"] == [0]
    # Nothing changed since: no further wake-up.
    assert not select.select([first.fileno()], [], [], 0.5)[0]


def test_no_wake_up_goes_to_a_closed_channel():
    server, agent = _pair()
    server.close()
    assert server.wake() is False  # its descriptor number may belong to another file now
    agent.close()


def test_the_controller_end_refuses_an_empty_line(controller):
    # Only the agent's end skips wake-ups: a stranger's empty lines before the handshake
    # end the connection, as any line that is not a message does.
    info = json.loads(controller.paths.controller.read_text())
    chan = Channel.connect(info["host"], info["port"], 5.0)
    assert chan.recv()["auth"] == "challenge"
    chan.sock.sendall(b"\n" * 64)
    with pytest.raises((ChannelClosed, ConnectionResetError)):  # not the 5 s timeout
        chan.recv()
