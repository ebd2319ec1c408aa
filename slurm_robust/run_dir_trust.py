"""The run directory is a trust boundary: one owner, nobody else can write.

Whatever a run reads back from its run directory steers what runs as the job's user:
``config.json`` and ``versions/`` hold the workers' command, ``state.json`` the restart
budget, ``controller.json`` where the agents connect, the pickles (``function.pkl``,
``result.pkl``, submitit's) are code. So the directory, ``versions/`` and every such file
must belong to the run's owner and be writable by nobody else; a file another user could
have planted or replaced is refused, never used.

The rules, checked on every use (not once):

- the run directory, ``versions/`` and ``ckpt/`` (the durable checkpoint root) are
  directories owned by the run's owner with no group or other write bit; a directory
  this module creates is 0700;
- a file read back is opened ``O_NOFOLLOW | O_NONBLOCK`` (a planted link is refused, a
  planted FIFO cannot block the open) and checked on its descriptor (``fstat``): a regular
  file, the owner's, no group or other write bit. Files the launcher writes are 0600.

The owner is the caller by default (the job's own processes). An admin tool run as root
passes the owner it expects: the job's user (from Slurm) or, for a directory named on the
command line, the directory's owner, so that a directory whose files belong to different
users is refused either way.

Sharing a run directory with a group is not supported: a group member could plant a
version or a pickle between two allocations, and telling their files from ours would need
every file to carry a MAC with the run secret (docs/SECURITY.md).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

from slurm_robust.records import write_json_atomic
from slurm_robust.secure_fs import UnsafePathError

#: Directories a run keeps under its run directory that steer what runs.
TRUSTED_SUBDIRS = ("versions", "ckpt")
#: The largest JSON document read back (a state file with years of signatures is ~1 MB).
MAX_JSON_BYTES = 64 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UntrustedRunDirError(UnsafePathError):
    """A run directory, or a file in it, that someone other than its owner could write."""


def expected_owner(owner: int | None) -> int:
    return os.geteuid() if owner is None else owner


def run_dir_owner(run_dir: str | os.PathLike[str], owner: int | None = None) -> int:
    """Whose files a reader of ``run_dir`` accepts: ``owner`` when given (an admin tool
    passes the job's user), else the caller, except root, for whom a directory named to it
    is trusted as its owner's (root runs no run's code; every file must then be that
    owner's, so a directory mixing users' files is still refused)."""
    if owner is not None:
        return owner
    uid = os.geteuid()
    return os.stat(run_dir).st_uid if uid == 0 else uid


def _check(st: os.stat_result, where: str, owner: int, want_dir: bool) -> None:
    kind = "directory" if want_dir else "regular file"
    if not (stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)):
        raise UntrustedRunDirError(f"{where} is not a {kind} (planted by someone else?); "
                                   "refusing it: remove it, or use another run directory")
    if st.st_uid != owner:
        raise UntrustedRunDirError(
            f"{where} is owned by uid {st.st_uid}, not by the run's user (uid {owner}); "
            "refusing it (another user created it first?): use another run directory")
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise UntrustedRunDirError(
            f"{where} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"refusing it: `chmod go-w {where}` if it is yours, or use another run directory")


def check_dir(path: str | os.PathLike[str], owner: int | None = None) -> os.stat_result:
    """Raise UntrustedRunDirError unless ``path`` is a directory of ``owner`` that no one
    else can write (a link to one is accepted only when the link is the owner's too);
    FileNotFoundError when absent."""
    path = Path(path)
    uid = expected_owner(owner)
    lst = os.lstat(path)
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid != uid:
        raise UntrustedRunDirError(f"{path} is a symlink owned by uid {lst.st_uid}, not by "
                                   f"the run's user (uid {uid}); refusing to follow it")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    _check(st, str(path), uid, want_dir=True)
    return st


def check_run_dir(run_dir: str | os.PathLike[str], owner: int | None = None) -> None:
    """The run directory and the trusted directories in it that exist (see the module
    docstring); raises UntrustedRunDirError, FileNotFoundError when the run dir is absent."""
    root = Path(run_dir)
    check_dir(root, owner)
    for name in TRUSTED_SUBDIRS:
        try:
            check_dir(root / name, owner)
        except FileNotFoundError:
            continue


def ensure_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    """Create the run directory private (0700), or verify a pre-existing one: it must be
    the caller's and not writable by group or others. Nothing is chmod-ed or deleted: a
    directory someone else made is refused with UntrustedRunDirError, and the run does not
    start in it. Missing parents are made with the umask's mode, like ``mkdir -p``."""
    root = Path(run_dir)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(root, 0o700)
        os.chmod(root, 0o700)  # the umask could only have narrowed it; be exact
    except FileExistsError:
        pass
    check_run_dir(root)
    return root


def write_json_as_owner(directory: str | os.PathLike[str], name: str, obj: Any,
                        owner: int) -> Path:
    """Write ``directory/name`` (JSON, 0600) as ``owner``, making ``directory`` (0700) if
    absent. Root's admin tools write into a user's run directory this way: in a child
    process with the user's uid and gid, so the kernel applies the user's own rights to
    every component of the path. A directory the user swapped for a link to /etc between
    our check and the write then fails as it would for the user, instead of root
    creating or chown-ing something there. Raises UnsafePathError with the child's reason.
    """
    target = Path(directory) / name
    if os.geteuid() != 0 or owner == 0:
        ensure_private_subdir(directory)
        write_json_atomic(target, obj, mode=0o600)
        return target
    try:
        gid = pwd.getpwuid(owner).pw_gid
    except KeyError:  # a uid without a passwd entry (a site's LDAP user seen from here)
        gid = owner
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to the user, write, report through the pipe
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(owner)
            ensure_private_subdir(directory)
            write_json_atomic(target, obj, mode=0o600)
            code = 0
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            os.write(write_end, f"{type(exc).__name__}: {exc}".encode()[:4000])
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as fh:
            reason = fh.read().decode(errors="replace")
    finally:
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise UnsafePathError(f"cannot write {target} as uid {owner}: "
                              f"{reason or 'the writer died'}")
    return target


def ensure_private_subdir(path: str | os.PathLike[str], owner: int | None = None) -> Path:
    """A directory under the run directory: created 0700 if absent, else verified.

    ``owner``: when root makes it for a user (an admin tool), the new directory is given
    to that user through a descriptor opened ``O_NOFOLLOW`` (a link swapped in meanwhile
    is refused, never chown-ed through)."""
    p = Path(path)
    uid = expected_owner(owner)
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    else:
        if uid != os.geteuid():
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchown(fd, uid, -1)
            finally:
                os.close(fd)
    check_dir(p, uid)
    return p


def read_trusted_bytes(path: str | os.PathLike[str], owner: int | None = None,
                       max_bytes: int | None = None) -> bytes:
    """The contents of a file of the run, checked on its descriptor first.

    Raises FileNotFoundError when absent, UntrustedRunDirError when it is a link, not a
    regular file, not the owner's or writable by group or others, or over ``max_bytes``.
    """
    path = Path(path)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise UntrustedRunDirError(f"{path} is a symlink (planted?); refusing to "
                                       "follow it: remove it") from exc
        raise
    try:
        st = os.fstat(fd)
        _check(st, str(path), expected_owner(owner), want_dir=False)
        if max_bytes is not None and st.st_size > max_bytes:
            raise UntrustedRunDirError(f"{path} is {st.st_size} bytes, over the "
                                       f"{max_bytes}-byte limit for it")
        os.set_blocking(fd, True)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_trusted_json(path: str | os.PathLike[str], owner: int | None = None) -> Any:
    """A JSON document of the run (see :func:`read_trusted_bytes`); ValueError when it
    is not JSON."""
    return json.loads(read_trusted_bytes(path, owner, MAX_JSON_BYTES))
