"""The controller's plan push (protocol.py): when an agent's plan changed, the controller
writes it to the agent unasked, and the waiting agent applies it without reporting first.

Real sockets, a real controller and real child processes; the bounds are loose on
purpose (a push that did not arrive would leave the wait to its 30 s timeout)."""

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
from slurm_robust.launcher.messages import Reply
from slurm_robust.launcher.node import workers as wk
from slurm_robust.launcher.protocol import Channel, ChannelClosed


def _pair() -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    agent = Channel(b, 5.0)
    agent.wakeups = True  # as Channel.connect makes the agent's end
    return Channel(a, 5.0), agent


PUSH = {"plan": {"role": "spare", "gen": 2}, "plan_id": "1.ab:cd", "push": True}


def test_the_agent_reads_what_arrived_without_blocking_and_keeps_a_partial_line():
    server, agent = _pair()
    t0 = time.monotonic()
    assert agent.read_ready() == (False, [])  # nothing yet: no wait for the 5 s timeout
    assert time.monotonic() - t0 < 1.0
    line = json.dumps(PUSH).encode() + b"\n"
    server.sock.sendall(line + line[:10])
    assert agent.read_ready() == (False, [PUSH])
    server.sock.sendall(line[10:] + b"\n")  # the rest, then an older controller's wake-up
    assert agent.read_ready() == (True, [PUSH])
    server.sock.sendall(line + b'{"plan": {}}\n')
    assert agent.recv() == PUSH and agent.recv() == {"plan": {}}
    server.close()
    with pytest.raises(ChannelClosed):
        agent.read_ready()


def test_a_push_is_a_reply_marked_pushed_and_never_unchanged():
    reply = Reply.from_json(PUSH)
    assert reply.push and reply.plan is not None and reply.plan.gen == 2
    assert reply.to_json() == PUSH
    from slurm_robust.launcher.messages import BadMessage
    with pytest.raises(BadMessage, match="never pushed"):
        Reply.from_json({"unchanged": True, "plan_id": "x", "push": True})
    with pytest.raises(BadMessage, match="names its 'plan_id'"):
        Reply.from_json({"plan": {"role": "spare", "gen": 2}, "push": True})
    with pytest.raises(BadMessage, match="'push'"):
        Reply.from_json({"plan": {"role": "spare", "gen": 2}, "plan_id": "x", "push": 1})


def test_the_agent_wait_ends_on_a_push(tmp_path: Path):
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    w = wk.Worker(0, 0, 0, popen, tmp_path / "log", tmp_path / "progress", time.time())
    server, agent = _pair()
    try:
        t0 = time.monotonic()
        wk.wait_for_exit([w], 0.3, wake_fd=agent.fileno())
        assert time.monotonic() - t0 >= 0.3  # nothing to wake it: the full wait
        server.send(PUSH)
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


def test_the_controller_pushes_the_new_plan_to_an_agent_that_did_not_ask(controller):
    first, second = _agent(controller, 0), _agent(controller, 1)
    assert first.request(_report(controller, 0))["plan"] == {}  # gathering: no plan yet
    second.request(_report(controller, 1))
    # The generation starts in the controller's tick: the first agent, which has not
    # asked since, gets its plan pushed, not left to its heartbeat (30 s here).
    t0 = time.monotonic()
    assert select.select([first.fileno()], [], [], 10.0)[0]
    assert time.monotonic() - t0 < 10.0
    pushed = Reply.from_json(first.recv())
    assert pushed.push and pushed.plan is not None and pushed.plan_id
    assert pushed.plan.gen == 1 and pushed.plan.role.value == "active"
    assert pushed.plan.ranks == [0]
    # Nothing changed since: nothing more is pushed, and a report naming the pushed plan
    # is answered "unchanged" (the agent holds it).
    assert not select.select([first.fileno()], [], [], 0.5)[0]
    report = {**_report(controller, 0), "gen": 1, "plan_id": pushed.plan_id}
    assert first.request(report) == {"unchanged": True, "plan_id": pushed.plan_id}


def test_the_controller_end_refuses_an_empty_line(controller):
    # Only the agent's end skips wake-ups: a stranger's empty lines before the handshake
    # end the connection, as any line that is not a message does.
    info = json.loads(controller.paths.controller.read_text())
    chan = Channel.connect(info["host"], info["port"], 5.0)
    assert chan.recv()["auth"] == "challenge"
    chan.sock.sendall(b"\n" * 64)
    with pytest.raises((ChannelClosed, ConnectionResetError)):  # not the 5 s timeout
        chan.recv()
