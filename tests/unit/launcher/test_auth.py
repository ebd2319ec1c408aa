"""The control channel refuses strangers and bad messages; the run goes on (an
unauthenticated peer, a wrong secret, oversized and malformed messages)."""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import threading

import pytest

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


def test_strangers_are_refused_by_address_and_by_the_cap(controller):
    controller.allowed = {"10.255.255.1"}
    chan = _connect(controller)
    with pytest.raises((ChannelClosed, OSError)):
        chan.recv()
    controller.allowed = set()
    controller.max_connections = 1
    first = _connect(controller)
    assert first.recv()["auth"] == "challenge"
    second = _connect(controller)
    with pytest.raises((ChannelClosed, OSError)):
        second.recv()


def test_a_stranger_cannot_make_the_controller_buffer_megabytes(controller):
    chan = _connect(controller)
    assert chan.recv()["auth"] == "challenge"
    with pytest.raises((ChannelClosed, OSError)):
        chan.sock.sendall(b"x" * 65536)  # no newline: a message that never ends
        chan.recv()
