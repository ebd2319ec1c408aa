"""Checkpoint configuration and the one place that names every path."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from slurm_robust.errors import UsageError
from slurm_robust.secure_fs import UnsafePathError, private_dir, relative_parts

log = logging.getLogger("slurm_robust.ckpt")

#: Restore walks the tiers in this order; the names match the run event log's
#: ``restore_tier`` field (docs/SCHEMAS.md).
TIERS: tuple[str, ...] = ("memory", "peer", "local", "durable")

CHECKSUMS: tuple[str, ...] = ("crc32", "sum64")
#: Own snapshot slots of a rank whose snapshots are backed up on a peer (two without a
#: peer). With three, and each snapshot waiting for the previous one's peer exchange,
#: a step common to every rank survives the loss of any one node: every survivor still
#: holds the two steps before the one it is writing, and the lost rank's holder has
#: received the older of them (ranks are kept in step by the training's collectives).
#: With two, a backup running one step late leaves survivors holding only steps the
#: lost rank's holder never received: no common step, a restore from disk or scratch.
OWN_SLOTS_WITH_PEER = 3
OWN_SLOTS = 2
#: The environment variable that carries a worker's checkpoint settings (JSON), set by
#: the launcher's agent, read by slurm_robust.train.
CKPT_ENV = "SLURM_ROBUST_CKPT"
#: The fields that cross to the worker; the others keep their defaults there.
ENV_FIELDS: tuple[str, ...] = ("shm_root", "local_root", "durable_root", "local_every",
                               "durable_every", "peer_backup", "peer_slots", "job_key")
MiB = 1 << 20


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often each tier is written.

    Attributes:
        shm_root: root of the memory tier (a tmpfs such as /dev/shm). Files there
            outlive a crashed worker; purge_job_memory() removes a job's files.
        local_root: node-local disk root, or None for no local tier.
        durable_root: shared durable storage root, or None for no durable tier.
        local_every: write the local tier every this many steps (0: never).
        durable_every: write the durable tier every this many steps (0: never).
        keep_local: local-tier steps kept per rank (older ones are deleted).
        keep_durable: durable-tier steps kept (older ones are deleted).
        peer_backup: send each snapshot to a peer rank on another node.
        peer_slots: buffers for the peer's backup. 1 keeps host memory at the own
            snapshots (3x state with a peer) plus one backup, but a node lost while its
            backup is in flight leaves no valid backup (restore falls to disk); 2 removes
            that window.
        chunk_bytes: size of one peer-transfer message.
        checksum: "sum64" (default: wrapping sum of 64-bit words, about 20-28 GB/s here;
            detects bit flips and torn copies, not swapped words) or "crc32" (zlib, about
            4 GB/s here). On CPU the checksum runs on the cores that train: crc32 every
            step cost about 4% of a step in `bench ckpt`, sum64 stays within noise.
        checksum_threads: threads that sum64 a snapshot; 0 (default) means 4 when the
            state is on a GPU (the node's cores are not training) and 1 on CPU (they are).
        peer_timeout_s: timeout of the private gloo groups (agreement and transfer).
        pin_memory: on CUDA, register the shared-memory buffers as pinned pages.
        job_key: the job's directory name under every tier root: the job id plus a keyed
            hash of the run's secret (the agent derives it), so other users cannot guess
            or pre-create it; None means ``<job id>.u<uid>`` (a run outside the launcher;
            see job_dir_name).
    """

    shm_root: str = "/dev/shm/slurm_robust"
    local_root: str | None = None
    durable_root: str | None = None
    local_every: int = 0
    durable_every: int = 0
    keep_local: int = 2
    keep_durable: int = 2
    peer_backup: bool = True
    peer_slots: int = 1
    chunk_bytes: int = 16 * MiB
    checksum: str = "sum64"
    checksum_threads: int = 0
    peer_timeout_s: float = 300.0
    pin_memory: bool = True
    job_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("local_every", "durable_every"):
            if getattr(self, name) < 0:
                raise UsageError(f"CheckpointConfig.{name} is {getattr(self, name)}; use >= 0")
        if self.local_every and not self.local_root:
            raise UsageError("CheckpointConfig: local_every > 0 needs local_root")
        if self.durable_every and not self.durable_root:
            raise UsageError("CheckpointConfig: durable_every > 0 needs durable_root")
        if self.keep_local < 1 or self.keep_durable < 1:
            raise UsageError("CheckpointConfig: keep_local and keep_durable must be >= 1")
        if self.peer_slots not in (1, 2):
            raise UsageError(f"CheckpointConfig.peer_slots is {self.peer_slots}; use 1 or 2")
        if self.chunk_bytes < 4096:
            raise UsageError(f"CheckpointConfig.chunk_bytes is {self.chunk_bytes}; use >= 4096")
        if self.checksum not in CHECKSUMS:
            raise UsageError(f"CheckpointConfig.checksum is {self.checksum!r}; use one of "
                             f"{', '.join(CHECKSUMS)}")
        if not 0 <= self.checksum_threads <= 64:
            raise UsageError(f"CheckpointConfig.checksum_threads is {self.checksum_threads}; "
                             "use 0 (auto) to 64")
        if self.peer_timeout_s <= 0:
            raise UsageError("CheckpointConfig.peer_timeout_s must be > 0")

    def to_env(self) -> dict[str, str]:
        """``{CKPT_ENV: JSON}`` for a worker's environment (the fields of ENV_FIELDS)."""
        return {CKPT_ENV: json.dumps({name: getattr(self, name) for name in ENV_FIELDS})}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 peer_backup: bool = True) -> CheckpointConfig:
        """The settings :meth:`to_env` wrote; a missing variable or field keeps its default
        (``peer_backup`` gives the default for that one: off for a single rank)."""
        e = os.environ if env is None else env
        try:
            spec = json.loads(e.get(CKPT_ENV) or "{}")
        except ValueError as exc:
            raise UsageError(f"{CKPT_ENV} is not JSON ({exc}); it is set by the launcher's "
                             "agent") from exc
        if not isinstance(spec, dict):
            raise UsageError(f"{CKPT_ENV} must be a JSON object, got {type(spec).__name__}")
        return cls(shm_root=spec.get("shm_root") or cls.shm_root,
                   local_root=spec.get("local_root"), durable_root=spec.get("durable_root"),
                   local_every=int(spec.get("local_every") or 0),
                   durable_every=int(spec.get("durable_every") or 0),
                   peer_backup=bool(spec.get("peer_backup", peer_backup)),
                   peer_slots=int(spec.get("peer_slots") or 1),
                   job_key=str(spec["job_key"]) if spec.get("job_key") else None)


def _safe_name(kind: str, value: str) -> str:
    # Job ids and node names become path components: refuse separators and dot-dot.
    if not value or "/" in value or value in (".", "..") or "\0" in value:
        raise UsageError(f"{kind} {value!r} cannot be used in a checkpoint path")
    return value


def job_dir_name(config: CheckpointConfig, job_id: str) -> str:
    """The job's directory name under every tier root: ``config.job_key`` when the
    launcher set one (unguessable), else ``<job_id>.u<uid>``. The uid keeps users apart
    (a job id is visible to all in squeue) and makes whose directory it is explicit: one
    pre-created by someone else is refused with UnsafePathError naming its owner (use the
    launcher, whose keyed name cannot be guessed, where that matters)."""
    if config.job_key:
        return _safe_name("job key", config.job_key)
    return f"{_safe_name('job id', str(job_id))}.u{os.geteuid()}"


@dataclass(frozen=True)
class CkptPaths:
    """Every path of one rank's checkpoints (see the package docstring for the layout)."""

    config: CheckpointConfig
    job_id: str
    node: str
    rank: int

    def __post_init__(self) -> None:
        _safe_name("job id", self.job_id)
        _safe_name("node name", self.node)

    @property
    def memory_dir(self) -> Path:
        return Path(self.config.shm_root) / self.job_id / self.node / f"rank{self.rank}"

    def slot(self, k: int) -> Path:
        """Base path (without .data/.meta) of own snapshot slot k."""
        return self.memory_dir / f"slot{k}"

    def backup(self, k: int) -> Path:
        """Base path of backup slot k (it holds another rank's snapshot)."""
        return self.memory_dir / f"backup{k}"

    @property
    def memory_shared(self) -> Path:
        """The level above this job's memory copies, shared by every user's jobs."""
        return Path(self.config.shm_root)

    @property
    def local_shared(self) -> Path:
        return Path(self.config.local_root or ".") / self.node

    @property
    def durable_shared(self) -> Path:
        return Path(self.config.durable_root or ".")

    @property
    def local_dir(self) -> Path | None:
        if not self.config.local_root:
            return None
        return Path(self.config.local_root) / self.node / self.job_id / f"rank{self.rank}"

    def local(self, step: int) -> Path:
        if self.local_dir is None:
            raise UsageError("no local tier: CheckpointConfig.local_root is not set")
        return self.local_dir / f"step{step:010d}"

    @property
    def durable_dir(self) -> Path | None:
        if not self.config.durable_root:
            return None
        return Path(self.config.durable_root) / self.job_id

    def durable(self, step: int) -> Path:
        if self.durable_dir is None:
            raise UsageError("no durable tier: CheckpointConfig.durable_root is not set")
        return self.durable_dir / f"step{step:010d}" / f"rank{self.rank}"


def ensure_dir(path: Path, shared_root: Path, private_root: bool = False) -> None:
    """Create or reuse ``path``: ``shared_root`` (and missing levels above it) is shared
    (created 1777; 0700 with ``private_root``, the durable tier's), every level below it
    is private to us.

    Levels below the root are walked with O_NOFOLLOW and checked on every call (ours,
    mode 0700): a directory or symlink another user planted raises UnsafePathError
    and is never used.
    """
    with private_dir(shared_root, relative_parts(path, shared_root), create=True,
                     private_root=private_root):
        pass


def private_dir_ok(path: Path, shared_root: Path) -> bool:
    """Whether ``path`` exists as a private directory chain of ours below the root
    (a planted or unsafe level is logged and counts as absent)."""
    try:
        with private_dir(shared_root, relative_parts(path, shared_root), create=False):
            return True
    except FileNotFoundError:
        return False
    except (UnsafePathError, OSError) as exc:
        log.warning("ignoring checkpoint directory %s: %s", path, exc)
        return False


def purge_job_memory(config: CheckpointConfig, job_id: str, node: str | None = None) -> int:
    """Delete a job's shared-memory snapshots (one node's, or every node's); return bytes freed.

    The memory tier outlives worker crashes on purpose, so whoever owns the job's lifetime
    on a node (the agent at job end, or the epilog) must call this.
    """
    root = Path(config.shm_root) / _safe_name("job id", job_id)
    if node is not None:
        root = root / _safe_name("node name", node)
    freed = 0
    if not private_dir_ok(root, Path(config.shm_root)):
        return 0  # absent, or planted by someone else: never walk into it
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                freed += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    shutil.rmtree(root, ignore_errors=True)
    if node is not None:
        try:
            root.parent.rmdir()  # the last node purged removes the job directory
        except OSError:
            pass
    return freed
