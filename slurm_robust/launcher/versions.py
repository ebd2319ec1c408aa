"""Immutable code versions of a running job and its change log.

A *version* is what the workers run: a snapshot of the training code (a copy of a code
directory, or ``git archive`` of a revision) under ``<run_dir>/versions/v<N>/code``, plus
the worker command line and an environment delta. Version 0 is the command the run was
submitted with (no snapshot: the files it names). Snapshots are never changed after they
are made (files 0400, directories 0500, under a 0700 ``versions/`` owned by the run's
owner), so running workers never see a file change under them.

Files (docs/SCHEMAS.md "Change log")::

    <run_dir>/versions/                 0700
    <run_dir>/versions/v<N>.json        the version record (CodeVersion.to_dict)
    <run_dir>/versions/v<N>/code/       the snapshot (read-only)
    <run_dir>/versions/request.json     the one pending request for the controller
    <run_dir>/versions/current.json     the version the controller runs (kept across
                                        requeues: a requeued job keeps its version)
    <run_dir>/versions/.update.lock     held while `slurm-robust update` makes a version
    <run_dir>/changes.jsonl             the change log (slurm_robust.change, version 1)

The CLI (``slurm-robust update``) makes the version and drops the request; the controller
(control/hot_update.py) picks it up on its tick, and both append to the change log.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypedDict

from slurm_robust.errors import UsageError
from slurm_robust.records import append_record, read_records, write_json_atomic
from slurm_robust.run_dir_trust import (
    UntrustedRunDirError,
    check_dir,
    read_trusted_json,
)
from slurm_robust.scriptenv import is_python

CHANGE_SCHEMA = "slurm_robust.change"
CHANGE_VERSION = 1
VERSION_RECORD_VERSION = 1
REQUEST_VERSION = 1
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Never copied into a snapshot: VCS metadata and byte-code caches are not the code.
_SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.pyc")


class ChangeEvent(StrEnum):
    """What a change-log line records."""

    REQUESTED = "requested"      # `slurm-robust update` made a version and asked for it
    STAGED = "staged"            # the controller holds it for the next restart
    APPLIED = "applied"          # the controller restarted the workers on it
    RESUMED = "resumed"          # the first step on it finished (downtime known)
    ROLLED_BACK = "rolled_back"  # back to the previous version (automatic or --rollback)
    REFUSED = "refused"          # the controller could not use the request


class ApplyMode(StrEnum):
    """When a requested version takes effect."""

    NOW = "now"                          # at the next step boundary
    AT_NEXT_RESTART = "at_next_restart"  # at the next in-place/spare restart or deadline
    ROLLBACK = "rollback"                # back to the previous version, now


class CodeVersionRecord(TypedDict):
    """A :class:`CodeVersion` as its ``version.json`` holds it."""

    v: int
    number: int
    kind: str
    source: str | None
    rev: str | None
    digest: str | None
    path: str | None
    command: list[str]
    env: dict[str, str]
    args: list[str] | None
    who: str
    when: float
    message: str


class RequestRecord(TypedDict):
    """An :class:`UpdateRequest` as ``versions/request.json`` holds it."""

    v: int
    version: int | None
    mode: str
    requested_at: float
    deadline_s: float | None
    rollback_steps: int
    who: str
    message: str


@dataclass(frozen=True)
class CodeVersion:
    """One version of what the workers run (see the module docstring)."""

    number: int
    kind: str                 # original | code | git
    source: str | None        # the code directory or repository it was made from
    rev: str | None           # git: the commit it resolved to
    digest: str | None        # sha256 over the snapshot's paths and contents
    path: str | None          # the snapshot directory (None for version 0)
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] | None = None
    who: str = ""
    when: float = 0.0
    message: str = ""

    def to_dict(self) -> CodeVersionRecord:
        return {"v": VERSION_RECORD_VERSION, "number": self.number, "kind": self.kind,
                "source": self.source, "rev": self.rev, "digest": self.digest,
                "path": self.path, "command": list(self.command), "env": dict(self.env),
                "args": None if self.args is None else list(self.args), "who": self.who,
                "when": self.when, "message": self.message}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CodeVersion:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class UpdateRequest:
    """What the CLI asks the controller (``versions/request.json``)."""

    version: int | None        # None with mode rollback
    mode: ApplyMode
    requested_at: float
    deadline_s: float | None = None
    rollback_steps: int = 10
    who: str = ""
    message: str = ""

    def to_dict(self) -> RequestRecord:
        return {"v": REQUEST_VERSION, "version": self.version, "mode": self.mode.value,
                "requested_at": self.requested_at, "deadline_s": self.deadline_s,
                "rollback_steps": self.rollback_steps, "who": self.who,
                "message": self.message}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> UpdateRequest:
        known = set(cls.__dataclass_fields__)
        values = {k: v for k, v in raw.items() if k in known}
        values["mode"] = ApplyMode(values["mode"])
        return cls(**values)


# ---------------------------------------------------------------------- paths
def versions_dir(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "versions"


def changes_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / "changes.jsonl"


def request_path(run_dir: str | os.PathLike[str]) -> Path:
    return versions_dir(run_dir) / "request.json"


def current_path(run_dir: str | os.PathLike[str]) -> Path:
    return versions_dir(run_dir) / "current.json"


def record_path(run_dir: str | os.PathLike[str], number: int) -> Path:
    return versions_dir(run_dir) / f"v{number}.json"


def who_am_i() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


# ---------------------------------------------------------------------- snapshots
def ensure_versions_dir(run_dir: str | os.PathLike[str]) -> Path:
    """``versions/`` (0700), owned by whoever owns the run directory.

    Raises UsageError when it exists but is not a private directory of the caller (a
    link or another user's directory would let someone else swap the code)."""
    root = versions_dir(run_dir)
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UsageError(f"{root} is not a private directory of uid {os.geteuid()} "
                         "(expected mode 0700, not a link); fix or remove it")
    return root


def _read_versions_json(path: Path, owner: int | None) -> Any:
    """A file under ``versions/``: the directory and the file must be the run owner's
    and writable by nobody else (run_dir_trust.py): they decide what the workers run."""
    check_dir(path.parent, owner)
    return read_trusted_json(path, owner)


def tree_digest(root: Path) -> str:
    """sha256 over every file's relative path, link target or contents, sorted."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            h.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            h.update(f"F {rel} {path.stat().st_size}\n".encode())
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        elif path.is_dir():
            h.update(f"D {rel}\n".encode())
    return h.hexdigest()


def _freeze(root: Path) -> None:
    """Files 0400 (0500 when executable), directories 0500: nothing changes under
    running workers (the owner could chmod back, which is a deliberate act)."""
    for dirpath, _dirs, filenames in os.walk(root, topdown=False):
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                continue
            p.chmod(0o500 if os.stat(p).st_mode & 0o100 else 0o400)
        Path(dirpath).chmod(0o500)


def copy_code(src: Path, dest: Path) -> None:
    """Copy a code directory (links copied as links, .git and caches left out)."""
    if not src.is_dir():
        raise UsageError(f"--code {src}: not a directory")
    shutil.copytree(src, dest, symlinks=True, ignore=_SKIP)


def git_toplevel(path: Path) -> Path:
    out = _git(path, "rev-parse", "--show-toplevel")
    return Path(out.strip())


def resolve_rev(repo: Path, rev: str) -> str:
    """The full commit id of ``rev`` in ``repo``; UsageError when it is unknown."""
    if rev.startswith("-"):
        raise UsageError(f"--git {rev!r}: not a revision")
    return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}",
                what=f"--git {rev}: unknown revision in {repo}").strip()


def export_rev(repo: Path, commit: str, dest: Path) -> None:
    """``git archive`` of ``commit`` unpacked into ``dest`` (the tree at that revision,
    without touching the repository's work tree or index)."""
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as tar:
        proc = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit],
                              stdout=tar, stderr=subprocess.PIPE, timeout=300, check=False)
        if proc.returncode != 0:
            raise UsageError(f"git archive {commit} in {repo} failed: "
                             f"{proc.stderr.decode(errors='replace').strip()}")
        tar.seek(0)
        with tarfile.open(fileobj=tar) as tf:
            # The "data" filter refuses absolute paths, links out of the tree, devices.
            tf.extractall(dest, filter="data")


def _git(repo: Path, *args: str, what: str | None = None) -> str:
    if not repo.is_dir():
        raise UsageError(f"{repo}: not a directory")
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                              text=True, timeout=60, check=False)
    except FileNotFoundError as exc:
        raise UsageError("git is not installed; use --code DIR instead") from exc
    if proc.returncode != 0:
        raise UsageError(what or f"git {' '.join(args)} in {repo}: "
                                 f"{proc.stderr.strip() or proc.returncode}")
    return proc.stdout


# ---------------------------------------------------------------------- commands
def script_index(command: Sequence[str]) -> int:
    """Index of the script in a worker command (``python s.py ...`` -> 1, ``./s.sh`` -> 0).

    Raises UsageError for ``python -m module`` and ``python -c``: there is no file
    to swap for a snapshot's."""
    if command and is_python(command[0]):
        if len(command) < 2 or command[1].startswith("-"):
            raise UsageError(f"the run's command {' '.join(command)!r} names no script "
                             "file (python -m/-c); hot update needs `python SCRIPT ...`")
        return 1
    return 0


def derive_command(base: CodeVersion, snapshot: Path, source_root: Path,
                   args: Sequence[str] | None, built_at: Path | None = None) -> list[str]:
    """The new version's worker command: the base's, with its script taken from the
    snapshot at the same place relative to the code root, and ``args`` (when given)
    replacing the script's arguments. ``built_at``: where the snapshot is now, when it
    is still being built (it moves to ``snapshot`` afterwards)."""
    cmd = list(base.command)
    i = script_index(cmd)
    script = Path(cmd[i])
    if base.path is not None:
        rel = script.relative_to(base.path)
    else:
        try:
            rel = script.resolve().relative_to(source_root.resolve())
        except ValueError:
            # Launched from elsewhere: the script by its name at the top of the new code.
            rel = Path(script.name)
    new_script = snapshot / rel
    if not ((built_at or snapshot) / rel).is_file():
        raise UsageError(f"the new code has no {rel} (the run's script "
                         f"{cmd[i]}); point --code/--git at the directory that holds it")
    tail = list(args) if args is not None else cmd[i + 1:]
    return [*cmd[:i], str(new_script), *tail]


def parse_env(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise UsageError(f"--env {item!r}: use KEY=VALUE with KEY a variable name")
        out[key] = value
    return out


# ---------------------------------------------------------------------- records
def original_version(command: Sequence[str], env: Mapping[str, str]) -> CodeVersion:
    """Version 0: what the run was submitted with."""
    return CodeVersion(number=0, kind="original", source=None, rev=None, digest=None,
                       path=None, command=list(command), env=dict(env))


def load_version(run_dir: str | os.PathLike[str], number: int,
                 command: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 owner: int | None = None) -> CodeVersion:
    """Version ``number`` (0 is built from ``command``/``env``, the run's config).

    Raises UntrustedRunDirError when the record is not the run owner's (``owner``,
    default the caller) or others could have written it."""
    if number == 0:
        return original_version(command, env or {})
    path = record_path(run_dir, number)
    try:
        return CodeVersion.from_dict(_read_versions_json(path, owner))
    except FileNotFoundError as exc:
        raise UsageError(f"version {number} does not exist in {versions_dir(run_dir)}") \
            from exc


def version_numbers(run_dir: str | os.PathLike[str]) -> list[int]:
    root = versions_dir(run_dir)
    out = []
    for p in root.glob("v*.json") if root.is_dir() else ():
        try:
            out.append(int(p.stem[1:]))
        except ValueError:
            continue
    return sorted(out)


class Current(TypedDict):
    """``versions/current.json``: the version running, what it can roll back to (newest
    last), and a staged ``--at-next-restart`` request (an UpdateRequest's dict)."""

    version: int
    previous: list[int]
    staged: Any


def read_current(run_dir: str | os.PathLike[str], owner: int | None = None) -> Current:
    """``{"version": N, "previous": [..]}`` (version 0 and no history when unset).

    A ``current.json`` someone other than the run's owner could have written raises
    UntrustedRunDirError: the run must not fall back to another version silently, nor
    run the one it names."""
    try:
        raw = _read_versions_json(current_path(run_dir), owner)
    except (FileNotFoundError, ValueError):
        return {"version": 0, "previous": [], "staged": None}
    return {"version": int(raw.get("version", 0)),
            "previous": [int(x) for x in raw.get("previous", [])],
            "staged": raw.get("staged")}


def write_current(run_dir: str | os.PathLike[str], version: int,
                  previous: Sequence[int], staged: Mapping[str, Any] | None = None) -> None:
    """What the controller runs, what it can roll back to (newest last), and a staged
    --at-next-restart request: a requeued job's next controller continues from it."""
    write_json_atomic(current_path(run_dir), {"v": 1, "version": version,
                                              "previous": list(previous),
                                              "staged": dict(staged) if staged else None},
                      mode=0o600)


def append_change(run_dir: str | os.PathLike[str], event: ChangeEvent,
                  fields: Mapping[str, Any], now: float | None = None,
                  # open-ended: a change-log line, whose fields vary by event
                  ) -> dict[str, Any]:
    """One change-log line (docs/SCHEMAS.md "Change log")."""
    rec = {"schema": CHANGE_SCHEMA, "v": CHANGE_VERSION, "event": event.value,
           "time": time.time() if now is None else now, **fields}
    path = changes_path(run_dir)
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    append_record(path, rec)
    return rec


# open-ended: change-log lines as read, whose fields vary by event
def read_changes(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = changes_path(run_dir)
    if not path.exists():
        return []
    return list(read_records(path).records)


def take_request(run_dir: str | os.PathLike[str]) -> UpdateRequest | str | None:
    """The pending request, removed (the controller's side); a string says why a
    request file could not be read (it is removed too, so it cannot block updates)."""
    path = request_path(run_dir)
    try:
        raw = _read_versions_json(path, None)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UntrustedRunDirError) as exc:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # in a directory that is not ours: refused again on every poll
        return f"unreadable request: {exc}"
    path.unlink(missing_ok=True)
    try:
        return UpdateRequest.from_dict(raw)
    except (KeyError, TypeError, ValueError) as exc:
        return f"bad request: {exc}"


def put_request(run_dir: str | os.PathLike[str], req: UpdateRequest) -> None:
    """Drop the request for the controller; UsageError when one is still pending
    (two updates at once)."""
    root = versions_dir(run_dir)
    tmp = root / f".request.{secrets.token_hex(8)}.tmp"  # random: nothing to plant
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(req.to_dict(), fh)
    try:
        os.link(tmp, request_path(run_dir))  # atomic, and fails when one is pending
    except FileExistsError as exc:
        raise UsageError(f"an update is already pending for {run_dir} (the controller "
                         "has not taken it yet); wait and retry") from exc
    finally:
        tmp.unlink(missing_ok=True)


class UpdateLock:
    """``versions/.update.lock``, O_EXCL: one `slurm-robust update` at a time."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = versions_dir(run_dir) / ".update.lock"

    def __enter__(self) -> UpdateLock:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
        except FileExistsError as exc:
            raise UsageError(f"another update of this run is in progress ({self.path} "
                             "exists; remove it if no `slurm-robust update` runs)") from exc
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


def make_version(run_dir: str | os.PathLike[str], base: CodeVersion, *,
                 code: str | None, git: str | None, args: Sequence[str] | None,
                 env: Mapping[str, str], message: str, number: int) -> CodeVersion:
    """Snapshot the code as version ``number`` (under the caller's UpdateLock).

    Exactly one of ``code`` (a directory) or ``git`` (a revision of the repository
    that holds the run's script, or ``REPO:REV``) is given. Nothing is left behind on
    an error: the snapshot is built in a temporary directory and renamed into place."""
    root = versions_dir(run_dir)
    work = Path(tempfile.mkdtemp(prefix=f".v{number}.", dir=root))
    try:
        snap = work / "code"
        if code is not None:
            src = Path(code).absolute()
            if Path(run_dir).resolve().is_relative_to(src.resolve()):
                raise UsageError(f"--code {code} contains the run directory {run_dir}; "
                                 "point it at the code only")
            copy_code(src, snap)
            kind, source, rev = "code", str(src), None
        else:
            assert git is not None
            repo_arg, sep, rev_arg = git.rpartition(":")
            if sep and Path(repo_arg).is_dir():
                repo, rev_text = Path(repo_arg), rev_arg
            else:
                script = Path(base.command[script_index(base.command)])
                repo, rev_text = (script.parent if script.parent.is_dir() else Path.cwd()), git
            top = git_toplevel(repo.absolute())
            commit = resolve_rev(top, rev_text)
            export_rev(top, commit, snap)
            kind, source, rev = "git", str(top), commit
        final = root / f"v{number}"
        command = derive_command(base, final / "code", Path(source), args, built_at=snap)
        digest = tree_digest(snap)
        _freeze(snap)
        work.rename(final)
        final.chmod(0o700)
    except BaseException:
        _remove(work)
        raise
    ver = CodeVersion(number=number, kind=kind, source=source, rev=rev, digest=digest,
                      path=str(final / "code"), command=command,
                      env={**base.env, **env}, args=list(args) if args is not None else None,
                      who=who_am_i(), when=time.time(), message=message)
    write_json_atomic(record_path(run_dir, number), ver.to_dict(), mode=0o600)
    return ver


def _remove(path: Path) -> None:
    """rmtree that first makes frozen directories writable again."""
    if not path.exists():
        return
    for dirpath, _dirs, _files in os.walk(path):
        os.chmod(dirpath, 0o700)
    shutil.rmtree(path, ignore_errors=True)
