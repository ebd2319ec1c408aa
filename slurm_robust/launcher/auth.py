"""The per-run secret and what it proves: the control channel's handshake and the
checkpoint directory name no other user can guess.

The secret is 32 random bytes in ``<run_dir>/run.secret``, mode 0600, owned by the job's
user: only the job's own processes (the agents, the controller, the workers) can read
it. Whoever of them comes first creates it atomically (write a temp file, then
``link()``, which fails if the name exists), so every process sees the same bytes.

Handshake (both directions, HMAC-SHA256 over fresh nonces, before any message)::

    server -> client   {"auth": "challenge", "nonce": S}
    client -> server   {"auth": "response", "nonce": C, "mac": H(k, "client"|S|C)}
    server -> client   {"auth": "ok", "mac": H(k, "server"|C|S)}

A peer without the secret cannot produce the client's MAC (the server drops it), and a
fake controller cannot produce the server's (the agent drops it). Whatever a peer sends,
the handshake either passes or raises :class:`AuthError` (an OSError, like a failed
connect): nonces must be 32 hex digits and MACs are compared as bytes, so a non-ASCII
or non-string field is a refusal, never a TypeError that would end the process. The
whole exchange has one deadline, ``HANDSHAKE_S`` (``Channel.bounded``).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from slurm_robust.secure_fs import UnsafePathError, check_private

SECRET_NAME = "run.secret"
SECRET_BYTES = 32
#: Total seconds for the whole handshake, on either end (not per read).
HANDSHAKE_S = 5.0
_NONCE_HEX = 32
_HEX = frozenset("0123456789abcdef")


class AuthError(ConnectionError):
    """The peer failed the handshake (it does not hold this run's secret)."""


def secret_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / SECRET_NAME


def ensure_run_secret(run_dir: str | os.PathLike[str]) -> bytes:
    """Read this run's secret, creating it first if no process of the run has yet.

    Raises:
        UnsafePathError: the file is a link, not ours, or readable by others.
    """
    path = secret_path(run_dir)
    try:
        return read_run_secret(run_dir)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{SECRET_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process of the run won; use its secret
    finally:
        os.unlink(tmp)
    return read_run_secret(run_dir)


def read_run_secret(run_dir: str | os.PathLike[str]) -> bytes:
    """The run's secret (FileNotFoundError if absent; UnsafePathError if not private)."""
    path = secret_path(run_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symlink; refusing it") from exc
        raise
    try:
        check_private(os.fstat(fd), str(path), want_dir=False)
        data = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != SECRET_BYTES:
        raise UnsafePathError(f"{path} holds {len(data)} bytes, not {SECRET_BYTES}; "
                              "delete it and restart the run")
    return data


def ckpt_job_key(job_id: str, secret: bytes) -> str:
    """The checkpoint directory name of a job: the job id (for people) plus a keyed
    hash (so that no other user can create the directory first). Stable across
    restarts and requeues of the same run."""
    tag = hmac.new(secret, b"ckpt-dir:" + job_id.encode(), hashlib.sha256).hexdigest()
    return f"{job_id}.{tag[:32]}"


def _mac(secret: bytes, role: str, first: str, second: str) -> bytes:
    return hmac.new(secret, f"{role}|{first}|{second}".encode(),
                    hashlib.sha256).hexdigest().encode()


class _Chan(Protocol):
    def send(self, message: Mapping[str, object]) -> None: ...
    # open-ended: a peer's raw wire JSON, checked by _field before any use
    def recv(self) -> dict[str, Any]: ...


def _field(msg: Mapping[str, object], kind: str, name: str) -> str:
    if msg.get("auth") != kind or not isinstance(msg.get(name), str):
        raise AuthError(f"expected an auth {kind!r} message with {name!r}")
    return str(msg[name])


def _nonce(msg: Mapping[str, object], kind: str) -> str:
    nonce = _field(msg, kind, "nonce")
    if len(nonce) != _NONCE_HEX or not set(nonce) <= _HEX:
        raise AuthError(f"the auth {kind!r} nonce is not {_NONCE_HEX} hex digits")
    return nonce


def _same_mac(given: str, expected: bytes) -> bool:
    # Bytes on both sides: compare_digest raises TypeError on a non-ASCII str.
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)


def server_handshake(chan: _Chan, secret: bytes) -> None:
    """Prove the client holds the secret, then prove we do. Raises AuthError."""
    nonce = secrets.token_hex(_NONCE_HEX // 2)
    chan.send({"auth": "challenge", "nonce": nonce})
    msg = chan.recv()
    client_nonce = _nonce(msg, "response")
    if not _same_mac(_field(msg, "response", "mac"),
                     _mac(secret, "client", nonce, client_nonce)):
        raise AuthError("client failed the challenge (no or wrong run secret)")
    chan.send({"auth": "ok", "mac": _mac(secret, "server", client_nonce, nonce).decode()})


def client_handshake(chan: _Chan, secret: bytes) -> None:
    """Answer the server's challenge and check its proof. Raises AuthError."""
    server_nonce = _nonce(chan.recv(), "challenge")
    nonce = secrets.token_hex(_NONCE_HEX // 2)
    chan.send({"auth": "response", "nonce": nonce,
               "mac": _mac(secret, "client", server_nonce, nonce).decode()})
    if not _same_mac(_field(chan.recv(), "ok", "mac"),
                     _mac(secret, "server", nonce, server_nonce)):
        raise AuthError("controller failed the challenge (no or wrong run secret)")
