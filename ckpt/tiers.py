"""Disk tiers (atomic writes, pruning) and the scan of every copy a rank can see."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from slurm_robust.ckpt.blob import (
    DATA_SUFFIX,
    META_SUFFIX,
    CorruptCopyError,
    fsync_dir,
    open_copy_file,
    read_meta,
    verify,
    write_file_atomic,
)
from slurm_robust.ckpt.config import (
    OWN_SLOTS,
    OWN_SLOTS_WITH_PEER,
    CkptPaths,
    ensure_dir,
    private_dir_ok,
)
from slurm_robust.ckpt.plan import CopyInfo

log = logging.getLogger("slurm_robust.ckpt")
_STEP_RE = re.compile(r"^step(\d+)$")
_WRITE_CHUNK = 64 << 20


def write_disk_copy(data: np.ndarray, meta: bytes, base: Path, shared_root: Path,
                    private_root: bool = False) -> None:
    """Write a copy to disk: data first (fsync, rename), then the meta completion mark.

    Directories up to ``shared_root`` are created shared, or private with
    ``private_root`` (see ``ensure_dir``)."""
    ensure_dir(base.parent, shared_root, private_root)
    view = memoryview(data)
    chunks = [view[i:i + _WRITE_CHUNK] for i in range(0, view.nbytes, _WRITE_CHUNK)]
    write_file_atomic(base.with_name(base.name + DATA_SUFFIX), chunks, durable=True)
    write_file_atomic(base.with_name(base.name + META_SUFFIX), [meta], durable=True)
    fsync_dir(base.parent)


def remove_copy(base: Path) -> None:
    """Delete a copy, completion mark first so that no reader sees a mark without data."""
    for suffix in (META_SUFFIX, DATA_SUFFIX):
        try:
            os.unlink(base.with_name(base.name + suffix))
        except FileNotFoundError:
            pass


def prune_local(paths: CkptPaths, keep: int) -> None:
    local_dir = paths.local_dir
    if local_dir is None or not local_dir.is_dir():
        return
    steps = sorted(_steps_in(local_dir, META_SUFFIX))
    for step in steps[:-keep]:
        remove_copy(paths.local(step))


def prune_durable(paths: CkptPaths, keep: int) -> None:
    durable_dir = paths.durable_dir
    if durable_dir is None or not durable_dir.is_dir():
        return
    steps = sorted(int(m.group(1)) for p in durable_dir.iterdir()
                   if (m := _STEP_RE.match(p.name)))
    for step in steps[:-keep]:
        base = paths.durable(step)
        remove_copy(base)
        try:
            base.parent.rmdir()  # the last rank to prune removes the step directory
        except OSError:
            pass


def _steps_in(directory: Path, suffix: str) -> list[int]:
    out = []
    for p in directory.iterdir():
        if p.name.endswith(suffix):
            m = _STEP_RE.match(p.name[:-len(suffix)])
            if m:
                out.append(int(m.group(1)))
    return out


def header_matches(header: dict[str, Any], rank: int | None, world_size: int,
                   layout: dict[str, Any]) -> bool:
    """Whether a copy belongs to this run's world (and to ``rank``, unless None)."""
    return (header.get("world_size") == world_size and header.get("layout") == layout
            and (rank is None or header.get("rank") == rank)
            and isinstance(header.get("rank"), int) and isinstance(header.get("step"), int))


_INVALID: dict[str, Any] = {}


def _check(base: Path, rank: int | None, world_size: int, layout: dict[str, Any],
           full: bool) -> dict[str, Any] | None:
    """Header of a complete copy at ``base``; None if there is none (no completion mark);
    ``_INVALID`` (logged) if there is one but the copy is damaged or of another layout.
    """
    try:
        header, _skeleton = read_meta(base)
    except FileNotFoundError:
        return None
    except (CorruptCopyError, OSError, ValueError) as exc:
        log.warning("skipping checkpoint copy %s: %s", base, exc)
        return _INVALID
    if not header_matches(header, rank, world_size, layout):
        log.warning("skipping checkpoint copy %s: it belongs to another run layout "
                    "(rank %s, world %s, layout %s)", base, header.get("rank"),
                    header.get("world_size"), header.get("layout"))
        return _INVALID
    data = base.with_name(base.name + DATA_SUFFIX)
    try:
        with os.fdopen(open_copy_file(data), "rb") as fh:
            if os.fstat(fh.fileno()).st_size < header["nbytes"]:
                raise CorruptCopyError(f"{data}: shorter than {header['nbytes']} bytes")
            if full and header["nbytes"]:
                verify(header, np.memmap(fh, dtype=np.uint8, mode="r",
                                         shape=(header["nbytes"],)), str(data))
    except (CorruptCopyError, OSError, ValueError) as exc:
        log.warning("skipping checkpoint copy %s: %s", base, exc)
        return _INVALID
    return header


def scan_copies(paths: CkptPaths, world_size: int, layout: dict[str, Any],
                backup_slots: int) -> list[CopyInfo]:
    """Every complete copy this rank can read: its memory slots, the backups it holds,
    its local-disk copies and its durable copies.

    Memory and backup copies are verified in full here (a memory-speed pass); disk
    copies are verified when loaded, and a failure there excludes them and re-plans.
    """
    me = paths.rank
    candidates: list[tuple[str, Path, int | None, bool]] = []
    # Only directory chains that are ours and private are looked into: a planted
    # directory or link (another user's) is logged and skipped like a missing tier.
    if private_dir_ok(paths.memory_dir, paths.memory_shared):
        candidates += [("memory", paths.slot(k), me, True)
                       for k in range(max(OWN_SLOTS, OWN_SLOTS_WITH_PEER))]
        candidates += [("peer", paths.backup(k), None, True) for k in range(backup_slots)]
    if paths.local_dir is not None and private_dir_ok(paths.local_dir, paths.local_shared):
        candidates += [("local", paths.local(step), me, False)
                       for step in _steps_in(paths.local_dir, META_SUFFIX)]
    if paths.durable_dir is not None and private_dir_ok(paths.durable_dir,
                                                        paths.durable_shared):
        candidates += [("durable", paths.durable(int(m.group(1))), me, False)
                       for p in paths.durable_dir.iterdir() if (m := _STEP_RE.match(p.name))
                       and private_dir_ok(paths.durable(int(m.group(1))).parent,
                                          paths.durable_shared)]
    found: list[CopyInfo] = []
    for tier, base, rank, full in candidates:
        header = _check(base, rank, world_size, layout, full)
        if header is None:
            continue
        if header is _INVALID:
            found.append(CopyInfo(me, -1, tier, me, str(base), valid=False))
        elif tier != "peer" or header["rank"] != me:
            found.append(CopyInfo(header["rank"], header["step"], tier, me, str(base)))
    return found
