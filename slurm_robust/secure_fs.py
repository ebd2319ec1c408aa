"""Private directories under shared roots, walked without following links.

Shared roots (the memory tier's tmpfs root, a node-local disk root) are writable by
every user's jobs, so any name below them can be planted by another user before we get
there: a directory of theirs, or a symlink to one of our own files. Everything below a
shared root is therefore opened one component at a time with ``openat(O_NOFOLLOW |
O_DIRECTORY)`` from a descriptor of the root, and every private level is checked on
every use (owned by us, no group or other permission bits). A level that fails the check
is refused with :class:`UnsafePathError`; it is never chmod-ed or reused.

The shared root itself comes from the site config (trusted, so links in its path are
followed); it must be owned by root or by us, or be sticky when others can write to it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from slurm_robust.errors import SlurmRobustError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePathError(SlurmRobustError):
    """A path below a shared root is not ours (planted, a link, or too permissive)."""


def check_private(st: os.stat_result, where: str, want_dir: bool) -> None:
    """Raise UnsafePathError unless ``st`` is ours, of the right type, mode 0?00."""
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        raise UnsafePathError(f"{where}: not a {'directory' if want_dir else 'regular file'}"
                              " (planted by someone else?); remove it or change the root")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(f"{where}: owned by uid {st.st_uid}, not by us "
                              f"(uid {os.geteuid()}); another user created it first")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise UnsafePathError(f"{where}: mode {stat.S_IMODE(st.st_mode):o} lets other "
                              "users in; a private level must be 0700 (files 0600)")


def _check_shared_root(fd: int, where: str) -> None:
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise UnsafePathError(f"{where}: shared root is writable by others but not sticky "
                              f"(mode {mode:o}); make it 1777")
    if not mode & 0o022 and st.st_uid not in (0, os.geteuid()):
        raise UnsafePathError(f"{where}: shared root owned by uid {st.st_uid}, neither "
                              "root nor us")


def open_shared_root(root: Path, create: bool = True, private: bool = False) -> int:
    """A descriptor of the shared root (created 1777 if absent and ``create``; 0700 when
    ``private``: a root only this user's jobs use, such as a run's durable tier)."""
    if create and not root.exists():
        # Missing levels up to the root are shared by every user's jobs: sticky, like
        # /tmp, so others may add their own entries but not remove ours. A private root
        # is ours alone: nobody else gets to add or rename anything in it.
        for d in [*reversed(root.parents), root]:
            if d.exists():
                continue
            try:
                d.mkdir(mode=0o700)
                if not private:
                    os.chmod(d, 0o1777)
            except FileExistsError:
                pass
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_shared_root(fd, str(root))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_private_level(parent: int, name: str, where: str, create: bool) -> int:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePathError(f"{where}: invalid path component {name!r}")
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass  # another rank made it first; checked like any existing level
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePathError(f"{where}: is a symlink or not a directory (planted?); "
                                  "refusing to follow it") from exc
        raise
    try:
        check_private(os.fstat(fd), where, want_dir=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private_dir(root: Path, parts: Sequence[str], create: bool = True,
                     private_root: bool = False) -> int:
    """Walk ``root/parts...`` with O_NOFOLLOW; every part is a private 0700 level of ours.

    Returns a descriptor of the last level (the caller closes it). Raises
    UnsafePathError for a planted level, FileNotFoundError when absent and not ``create``.
    """
    fd = open_shared_root(root, create=create, private=private_root)
    where = str(root)
    try:
        for name in parts:
            where = f"{where}/{name}"
            nfd = _open_private_level(fd, name, where, create)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def private_dir(root: Path, parts: Sequence[str], create: bool = True,
                private_root: bool = False) -> Iterator[int]:
    fd = open_private_dir(root, parts, create, private_root)
    try:
        yield fd
    finally:
        os.close(fd)


def relative_parts(path: Path, root: Path) -> list[str]:
    """Components of ``path`` below ``root`` (raises UnsafePathError when outside)."""
    try:
        rel = path.relative_to(root)
    except ValueError as exc:
        raise UnsafePathError(f"{path} is not below its root {root}") from exc
    parts = list(rel.parts)
    if any(p in ("..", ".") for p in parts):
        raise UnsafePathError(f"{path}: '..' below root {root}")
    return parts


def open_file_in(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """Open ``name`` in a private directory without following a link; a file that
    exists must be a regular file of ours (0600)."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        check_private(os.fstat(fd), name, want_dir=False)
    except BaseException:
        os.close(fd)
        raise
    return fd
