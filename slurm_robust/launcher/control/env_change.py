"""Did the training's code or environment change since the run's last allocation?

ByteRobust's third-largest incident class is the code/data change, and no log line tells
an error a change caused from the same error in unchanged code (the classifier's
``change_recorded``). Changes made through ``slurm-robust update`` are recorded
by hot_update.py; this module records the ones made outside it: the user edits
``train.py`` or upgrades a package in the run's virtualenv and the job is requeued or
resubmitted into the same run directory.

Each new controller (a new allocation, or a failover successor) takes a fingerprint at
its first generation and compares it with the one in ``state.json``:

- ``files``: the sha256 of every argument of the training command that names a regular
  file (the script, a config, a data manifest), up to MAX_FILES of them; files above
  MAX_HASH_BYTES are fingerprinted by size and mtime, not read;
- ``packages``: the sha256 of the sorted ``name==version`` list of the distributions the
  command's interpreter sees, when that interpreter is this process's own (the launcher
  runs from the job's environment); another interpreter's packages are not looked at
  (``packages`` is None and ``packages_basis`` says why).

A difference is a *change* (``state.json``'s ``env_change``: the step the run had
reached, the attempt, what differs): the generations started within WINDOW_STEPS steps of
that step get ``code_change`` in their plans, so a user-side failure there, or an exit
with no named cause, is classified ``code_data_change`` (stop on repeat; never an
eviction; launcher/classify.py's ``_change_explains``). Files that are new or gone are
not compared (a hot-updated version runs from its own snapshot path); nor are packages
when either side could not see them.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

FINGERPRINT_VERSION = 1
MAX_FILES = 16
MAX_HASH_BYTES = 64 << 20
#: Steps past the step the run had reached within which a failure is the change's (as
#: ``slurm-robust update --rollback-steps``' default).
WINDOW_STEPS = 10


class FingerprintRecord(TypedDict):
    """A :class:`Fingerprint` as ``state.json`` keeps it."""

    v: int
    files: dict[str, str]
    packages: str | None
    packages_basis: str


class ChangeRecord(TypedDict):
    """``state.json``'s ``env_change``: a change found at a new allocation."""

    step: int | None
    attempt: int
    what: list[str]
    time: float


@dataclass(frozen=True)
class Fingerprint:
    """What the training command would run: its files and its interpreter's packages."""

    files: dict[str, str] = field(default_factory=dict)
    packages: str | None = None
    packages_basis: str = ""

    def to_dict(self) -> FingerprintRecord:
        return {"v": FINGERPRINT_VERSION, "files": dict(self.files),
                "packages": self.packages, "packages_basis": self.packages_basis}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> Fingerprint | None:
        """The stored fingerprint, or None when absent or of another version."""
        if not isinstance(raw, Mapping) or raw.get("v") != FINGERPRINT_VERSION:
            return None
        files = raw.get("files")
        pkgs = raw.get("packages")
        return cls(files={str(k): str(v) for k, v in files.items()}
                   if isinstance(files, Mapping) else {},
                   packages=str(pkgs) if isinstance(pkgs, str) else None,
                   packages_basis=str(raw.get("packages_basis") or ""))


def take(command: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> Fingerprint:
    """Fingerprint ``command`` as run from ``cwd`` (default: the current directory)."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    files: dict[str, str] = {}
    for arg in command[1:]:
        if len(files) >= MAX_FILES or arg.startswith("-") or "=" in arg:
            continue
        path = base / arg
        try:
            if path.is_file():
                files[arg] = _file_digest(path)
        except OSError:
            continue  # unreadable now: not a change we can see
    packages, basis = _packages(command[0] if command else "")
    return Fingerprint(files, packages, basis)


def changes(old: Fingerprint | None, new: Fingerprint) -> list[str]:
    """What differs, one phrase each (empty: nothing, or nothing to compare with)."""
    if old is None:
        return []
    what = [f"{name} changed" for name, digest in sorted(new.files.items())
            if name in old.files and old.files[name] != digest]
    if old.packages is not None and new.packages is not None and old.packages != new.packages:
        what.append("installed packages changed")
    return what


def recent(change: Mapping[str, Any], last_step: int | None) -> bool:
    """Whether the run is still within WINDOW_STEPS of the recorded ``change``."""
    at = change.get("step")
    if last_step is None or not isinstance(at, int):
        return True
    return last_step < at + WINDOW_STEPS


def _file_digest(path: Path) -> str:
    """The file's digest, judged on its descriptor: opened non-blocking and checked to be
    a regular file there, so that a FIFO swapped in after ``is_file`` (the path may lie
    in a directory others write) cannot block the controller, which runs this under its
    lock. Raises OSError for anything that is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > MAX_HASH_BYTES:
            return f"size:{st.st_size}:mtime_ns:{st.st_mtime_ns}"
        os.set_blocking(fd, True)
        h = hashlib.sha256()
        with os.fdopen(fd, "rb", closefd=False) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()
    finally:
        os.close(fd)


def _packages(interpreter: str) -> tuple[str | None, str]:
    own = os.path.realpath(sys.executable)
    found = shutil.which(interpreter) if interpreter else None
    if found is None or os.path.realpath(found) != own:
        return None, (f"the command's interpreter {interpreter!r} is not the launcher's "
                      f"({sys.executable}); its packages are not fingerprinted")
    names = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}"
                    for d in importlib.metadata.distributions()})
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
    return digest, f"{len(names)} distributions seen by {sys.executable}"
