"""The controller's report loop (control/report_loop.py): every connection served from one
thread, reports answered in batches, replies and pushed plans written without blocking
and in the order they were decided, and a bad or silent connection closed with its
reason."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence

import pytest

from slurm_robust.launcher.control.report_loop import Arrival, Connection, ReportLoop
from slurm_robust.launcher.protocol import Channel


class Controller:
    """The loop's callbacks, recording what they were given. A pushed "plan" here is a
    string: its line is ``{"push":"<plan>"}`` and its identity the string."""

    def __init__(self, reply: bytes = b'{"ok":true}\n') -> None:
        self.reply = reply
        self.batches: list[int] = []
        self.seen: list[dict] = []
        self.closed: list[tuple[Connection, str]] = []
        self.ended = threading.Event()
        self.pushed: list[tuple[Connection, str]] = []

    @staticmethod
    def encode_pushes(plans: Sequence[str]) -> list[tuple[bytes, str]]:
        return [(json.dumps({"push": plan}).encode() + b"\n", plan) for plan in plans]

    def on_pushed(self, conn: Connection, plan: str) -> None:
        self.pushed.append((conn, plan))

    def loop(self) -> ReportLoop:
        return ReportLoop(self.serve, self.on_closed, self.encode_pushes, self.on_pushed)

    def serve(self, batch: Sequence[Arrival]) -> list[bytes | None]:
        self.batches.append(len(batch))
        self.seen += [a.raw for a in batch]
        return [None if a.raw.get("close") else self.reply for a in batch]

    def on_closed(self, conn: Connection, why: str) -> None:
        self.closed.append((conn, why))
        self.ended.set()


@pytest.fixture()
def served():
    ctl = Controller()
    loop = ctl.loop()
    loop.start()
    yield ctl, loop
    loop.stop()


def connect(loop: ReportLoop, timeout_s: float = 30.0) -> tuple[socket.socket, Connection]:
    agent, server = socket.socketpair()
    agent.settimeout(10)
    conn = Connection(Channel(server, timeout_s), "peer", counted=True)
    loop.add(conn)
    return agent, conn


_unread: dict[socket.socket, bytes] = {}


def read_line(sock: socket.socket) -> bytes:
    """One line from ``sock`` (what came after it is kept for the next call)."""
    data = _unread.pop(sock, b"")
    while b"\n" not in data:
        chunk = sock.recv(1 << 20)
        assert chunk, "closed"
        data += chunk
    line, rest = data.split(b"\n", 1)
    if rest:
        _unread[sock] = rest
    return line + b"\n"


def test_many_agents_are_answered_from_one_thread(served):
    ctl, loop = served
    agents = [connect(loop)[0] for _ in range(300)]
    threads_before = threading.active_count()
    for i, sock in enumerate(agents):
        sock.sendall(json.dumps({"agent": i}).encode() + b"\n")
    for sock in agents:
        assert read_line(sock) == b'{"ok":true}\n'
    assert sorted(r["agent"] for r in ctl.seen) == list(range(300))
    assert threading.active_count() == threads_before  # no thread per connection
    assert max(ctl.batches) > 1  # rounds with several ready reports go as one batch
    assert not ctl.closed


def test_lines_read_ahead_by_the_handshake_are_answered(served):
    ctl, loop = served
    agent, server = socket.socketpair()
    chan = Channel(server, 30)
    chan._buf = b'{"agent":7}\n'
    loop.add(Connection(chan, "peer", counted=False))
    agent.settimeout(10)
    assert read_line(agent) == b'{"ok":true}\n' and ctl.seen == [{"agent": 7}]


@pytest.mark.parametrize("sent, why", [
    (b"not json\n", "not a JSON message"),
    (b"[1, 2]\n", "not a JSON object"),
    (b"\n", "not a JSON message"),  # a wake-up goes out only
    (b'{"close": true}\n', "answered with a close"),
])
def test_a_bad_line_or_a_refused_report_closes_that_connection_only(served, sent, why):
    ctl, loop = served
    bad, bad_conn = connect(loop)
    good, _ = connect(loop)
    bad.sendall(sent)
    assert ctl.ended.wait(10)
    assert ctl.closed[0][0] is bad_conn and why in ctl.closed[0][1]
    good.sendall(b'{"agent":1}\n')
    assert read_line(good) == b'{"ok":true}\n'


def test_an_oversized_message_closes_its_connection(served):
    ctl, loop = served
    agent, conn = connect(loop)
    conn.chan.max_message = 1000
    agent.sendall(b"{" + b" " * 5000)
    assert ctl.ended.wait(10) and "over 1000 bytes" in ctl.closed[0][1]


def test_a_peer_that_closes_is_reported_once(served):
    ctl, loop = served
    agent, conn = connect(loop)
    agent.close()
    assert ctl.ended.wait(10)
    time.sleep(0.3)
    assert [(c, w) for c, w in ctl.closed] == [(conn, "peer closed the connection")]


def test_a_silent_connection_is_closed_after_the_channels_timeout(served):
    ctl, loop = served
    _agent, conn = connect(loop, timeout_s=0.3)
    assert ctl.ended.wait(10)
    assert ctl.closed == [(conn, "silent for the channel's timeout")]


def test_a_reply_the_peer_does_not_read_yet_is_kept_whole_and_a_push_goes_after_it():
    big = b'{"plan":"' + b"x" * (4 << 20) + b'"}\n'  # far over a socket buffer
    ctl = Controller(reply=big)
    loop = ctl.loop()
    loop.start()
    try:
        agent, conn = connect(loop)
        agent.sendall(b'{"agent":0}\n')
        deadline = time.monotonic() + 10
        while not conn.out:
            assert time.monotonic() < deadline, "the reply went out whole at once"
            time.sleep(0.01)
        loop.push([(conn, "p2")])  # decided after the reply: it follows it, whole
        assert read_line(agent) == big
        assert read_line(agent) == b'{"push": "p2"}\n'
        assert ctl.pushed == [(conn, "p2")]
    finally:
        loop.stop()


def test_pushes_go_in_order_once_each_and_never_to_a_closed_connection(served):
    ctl, loop = served
    agent, conn = connect(loop)
    gone, gone_conn = connect(loop)
    gone.close()
    assert ctl.ended.wait(10)  # the loop saw it close
    loop.push([(conn, "p1"), (gone_conn, "p1"), (conn, "p2"), (conn, "p2")])
    assert read_line(agent) == b'{"push": "p1"}\n'
    assert read_line(agent) == b'{"push": "p2"}\n'
    # The same plan as the last one written on the connection is not written again.
    loop.push([(conn, "p2")])
    agent.sendall(b'{"agent":0}\n')
    assert read_line(agent) == b'{"ok":true}\n'  # the next line is the reply, no push
    assert [p for _, p in ctl.pushed] == ["p1", "p2"]
    assert conn.plan_id == "p2"


def test_a_push_decided_while_a_reply_is_decided_follows_that_reply():
    # The controller decides a new plan while it answers a batch (a report that ends a
    # failure's settle): the push is newer than the batch's replies and must follow them.
    ctl = Controller()
    serve = ctl.serve
    conns: list[Connection] = []

    def serve_and_push(batch):
        replies = serve(batch)
        loop.push([(conns[0], "p2")])
        return replies

    ctl.serve = serve_and_push  # type: ignore[method-assign]
    loop = ctl.loop()
    loop.start()
    try:
        agent, conn = connect(loop)
        conns.append(conn)
        agent.sendall(b'{"agent":0}\n')
        assert read_line(agent) == b'{"ok":true}\n'
        assert read_line(agent) == b'{"push": "p2"}\n'
    finally:
        loop.stop()


def test_stop_closes_every_connection_without_callbacks():
    ctl = Controller()
    loop = ctl.loop()
    loop.start()
    agent, _ = connect(loop)
    agent.sendall(b'{"agent":0}\n')
    assert read_line(agent) == b'{"ok":true}\n'
    loop.stop()
    assert not loop.alive()
    assert agent.recv(1) == b"" and not ctl.closed
