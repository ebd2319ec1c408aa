"""The control channel refuses strangers and bad messages; the run goes on (an
unauthenticated peer, a wrong secret, oversized and malformed messages)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_robust.launcher.auth import (
    AuthError,
    ckpt_job_key,
    client_handshake,
    ensure_run_secret,
    read_run_secret,
    server_handshake,
)
from slurm_robust.launcher.protocol import BadMessage, Channel, ChannelClosed, check_report
from slurm_robust.secure_fs import UnsafePathError


def _chan(sock):
    c = Channel(sock, 5)
    c.max_message = 4096
    return c


def _handshake(server_secret: bytes, client_secret: bytes):
    a, b = socket.socketpair()
    errors: dict[str, BaseException] = {}

    def serve():
        try:
            server_handshake(_chan(a), server_secret)
        except (AuthError, ChannelClosed, OSError) as exc:
            errors["server"] = exc
            a.close()

    t = threading.Thread(target=serve)
    t.start()
    try:
        client_handshake(_chan(b), client_secret)
    except (AuthError, ChannelClosed, OSError) as exc:
        errors["client"] = exc
    t.join()
    return errors


def test_handshake_needs_the_secret_on_both_ends():
    k = secrets.token_bytes(32)
    assert _handshake(k, k) == {}
    assert "server" in _handshake(k, secrets.token_bytes(32))


def test_secret_is_private_and_stable(tmp_path):
    a = ensure_run_secret(tmp_path)
    assert ensure_run_secret(tmp_path) == a == read_run_secret(tmp_path)
    assert stat.S_IMODE((tmp_path / "run.secret").stat().st_mode) == 0o600
    key = ckpt_job_key("17", a)
    assert key.startswith("17.") and key != ckpt_job_key("17", secrets.token_bytes(32))
    os.chmod(tmp_path / "run.secret", 0o644)
    with pytest.raises(UnsafePathError):
        read_run_secret(tmp_path)


def test_a_symlinked_secret_is_refused(tmp_path):
    (tmp_path / "other").write_bytes(b"x" * 32)
    os.chmod(tmp_path / "other", 0o600)
    os.symlink(tmp_path / "other", tmp_path / "run.secret")
    with pytest.raises(UnsafePathError):
        ensure_run_secret(tmp_path)


def _report(**kw):
    msg = {"op": "report", "key": "1.0.0", "agent": 0, "node": "n1", "pid": 5, "gen": 0,
           "time": 1.0, "exits": [], "progress": [], "states": {}, "stacks": {}}
    msg.update(kw)
    return msg


def test_check_report_refuses_what_the_controller_cannot_use():
    check_report(_report(), 2)
    for bad in (_report(agent="0"), _report(exits=[{"gen": 0, "rank": 0, "exit_code": 1,
                                                     "time": 1.0}]),
                _report(exits=[{"gen": 0, "rank": 9, "exit_code": 0, "time": 1.0}]),
                _report(exits="no")):
        with pytest.raises(BadMessage):
            check_report(bad, 2)
    msg = _report(progress=[{"rank": 0, "step": "x"}, {"rank": 0, "step": 1, "loss": "nan"},
                            {"rank": 1, "step": 2, "loss": 0.5}])
    check_report(msg, 2)
    assert msg["progress"] == [{"rank": 1, "step": 2, "loss": 0.5}]


@pytest.fixture
def controller(start_controller):
    return start_controller(5.0)


def _connect(ctl):
    info = json.loads(ctl.paths.controller.read_text())
    return Channel.connect(info["host"], info["port"], 5.0)


def test_controller_json_is_private(controller):
    assert stat.S_IMODE(controller.paths.controller.stat().st_mode) == 0o600


def test_a_forged_report_without_the_secret_gets_no_plan(controller):
    chan = _connect(controller)
    hello = chan.recv()
    assert hello["auth"] == "challenge"
    chan.send(_report(key=controller.ident.step_key))  # the key anyone can read: not enough
    with pytest.raises((ChannelClosed, OSError)):
        chan.recv()
    assert controller.agents == {}


def test_a_malformed_exit_record_closes_only_that_connection(controller):
    chan = _connect(controller)
    client_handshake(chan, controller.secret)
    ok = chan.request(_report(key=controller.ident.step_key))
    assert "plan" in ok and 0 in controller.agents
    chan.send(_report(key=controller.ident.step_key,
                      exits=[{"gen": 0, "rank": 0, "exit_code": 1, "time": 1.0}]))
    with pytest.raises((ChannelClosed, OSError)):
        chan.recv()
    # the run goes on: a new authenticated connection is served
    again = _connect(controller)
    client_handshake(again, controller.secret)
    assert "plan" in again.request(_report(key=controller.ident.step_key))
    assert controller.recovery.phase == "gather" and controller.connections >= 1


def test_strangers_are_refused_by_address_and_the_oldest_gives_way_at_the_cap(controller):
    controller.allowed = {"10.255.255.1"}
    chan = _connect(controller)
    with pytest.raises((ChannelClosed, OSError)):
        chan.recv()
    controller.allowed = set()
    controller.max_connections = 1
    first = _connect(controller)
    assert first.recv()["auth"] == "challenge"
    # At the cap the oldest unauthenticated connection is shut down, not the newcomer:
    # a stranger cannot keep a slot from an agent that connects after it.
    second = _connect(controller)
    assert second.recv()["auth"] == "challenge"
    with pytest.raises((ChannelClosed, OSError)):
        first.recv()


def test_a_stranger_cannot_make_the_controller_buffer_megabytes(controller):
    chan = _connect(controller)
    assert chan.recv()["auth"] == "challenge"
    with pytest.raises((ChannelClosed, OSError)):
        chan.sock.sendall(b"x" * 65536)  # no newline: a message that never ends
        chan.recv()


# ---------------------------------------------------------------- hostile handshakes
def _fake_controller(replies: list[bytes]) -> tuple[socket.socket, threading.Thread]:
    """A listening socket that sends ``replies`` (raw lines) to each client, as a
    stranger's server on a dead controller's port would."""
    srv = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        srv.settimeout(5)
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    for line in replies:
                        conn.sendall(line)
                        try:
                            conn.recv(4096)
                        except OSError:
                            break
        except OSError:
            return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t


def test_a_non_ascii_mac_is_a_refusal_not_a_type_error():
    k = secrets.token_bytes(32)
    a, b = socket.socketpair()
    nonce = "0" * 32

    def client():
        c = _chan(b)
        c.recv()
        c.send({"auth": "response", "nonce": nonce, "mac": "é" * 64})

    t = threading.Thread(target=client)
    t.start()
    with pytest.raises(AuthError):
        server_handshake(_chan(a), k)
    t.join()
    a2, b2 = socket.socketpair()
    b2.sendall(json.dumps({"auth": "challenge", "nonce": nonce}).encode() + b"\n")
    b2.sendall(json.dumps({"auth": "ok", "mac": "\u2603" * 64}).encode() + b"\n")
    with pytest.raises(AuthError):
        client_handshake(_chan(a2), k)


def _agent_connect(port: int, timeout_s: float):
    """The agent's own connect-and-handshake loop against 127.0.0.1:port."""
    from types import SimpleNamespace

    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.node.agent import Agent
    stub = SimpleNamespace(
        _controller_info=lambda: {"host": "127.0.0.1", "port": port},
        cfg=RunConfig(command=("true",), run_dir="/nonexistent", nodes=1,
                      heartbeat_timeout_s=2.0),
        secret=secrets.token_bytes(32))
    return Agent._connect(stub, timeout_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("replies", [
    [b'{"auth":"challenge","nonce":"00000000000000000000000000000000"}\n',
     '{"auth":"ok","mac":"\u00e9\u00e9"}\n'.encode()],
    [b'{"auth":"challenge","nonce":"\\ud800"}\n'],
    [b'{"auth":"challenge","nonce":5}\n'],
    [b"[" * 3000 + b"\n"],
    [b"x" * 8192],
])
def test_a_fake_controller_costs_the_agent_a_retry_not_its_life(replies):
    srv, _ = _fake_controller(replies)
    try:
        assert _agent_connect(srv.getsockname()[1], 0.5) is None
    finally:
        srv.close()


@settings(max_examples=150, deadline=None)
@given(first=st.dictionaries(st.text(max_size=8), st.recursive(
           st.none() | st.booleans() | st.integers() | st.text(max_size=70),
           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids,
                                                                     max_size=3),
           max_leaves=6), max_size=4),
       mac=st.one_of(st.text(max_size=70), st.integers(), st.none()))
def test_whatever_a_fake_controller_sends_the_client_raises_only_connection_errors(first, mac):
    for challenge in (first, {"auth": "challenge", "nonce": "ab" * 16}):
        a, b = socket.socketpair()
        with a, b:
            b.sendall(json.dumps(challenge).encode() + b"\n")
            b.sendall(json.dumps({"auth": "ok", "mac": mac}).encode() + b"\n")
            with pytest.raises(OSError):  # AuthError and ChannelClosed are OSErrors
                client_handshake(_chan(a), secrets.token_bytes(32))


def test_deeply_nested_json_closes_the_channel():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"[" * 3000 + b"\n")  # under the 4096-byte bound
        with pytest.raises(ChannelClosed):
            _chan(a).recv()


def test_the_handshake_has_a_total_deadline(controller, monkeypatch):
    import slurm_robust.launcher.control.controller as ctl_mod
    monkeypatch.setattr(ctl_mod, "HANDSHAKE_S", 1.0)
    chan = _connect(controller)
    assert chan.recv()["auth"] == "challenge"
    start = time.monotonic()
    closed_after = None
    while time.monotonic() - start < 6.0:
        try:
            chan.sock.sendall(b" ")  # one byte every 0.3 s: each read is well in time
            chan.sock.settimeout(0.3)
            if chan.sock.recv(1) == b"":
                closed_after = time.monotonic() - start
                break
        except TimeoutError:
            continue
        except OSError:
            closed_after = time.monotonic() - start
            break
    assert closed_after is not None and closed_after < 3.0


def test_unauthenticated_connections_per_address_are_bounded(controller):
    from slurm_robust.launcher.control.admission import PREAUTH_PER_PEER
    strangers = [_connect(controller) for _ in range(PREAUTH_PER_PEER + 5)]
    for s in strangers:
        try:
            s.recv()  # the challenge, or a close for the oldest
        except (ChannelClosed, OSError):
            pass
    assert controller.preauth.count("127.0.0.1") <= PREAUTH_PER_PEER
    closed = 0
    for s in strangers[:5]:
        s.sock.settimeout(2)
        try:
            closed += s.sock.recv(1) == b""
        except OSError:
            closed += 1
    assert closed == 5  # the oldest gave way
    # An agent arriving behind the strangers still gets in.
    chan = _connect(controller)
    with chan.bounded(5.0, 4096):
        client_handshake(chan, controller.secret)
    assert "plan" in chan.request(_report(key=controller.ident.step_key))
    for s in strangers:
        s.close()
