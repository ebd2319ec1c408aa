"""Preallocated snapshot buffers: files in shared memory mapped as flat uint8 tensors."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from slurm_robust.ckpt.blob import DATA_SUFFIX, META_SUFFIX, TensorSpec
from slurm_robust.ckpt.config import ensure_dir
from slurm_robust.ckpt.errors import CheckpointError

log = logging.getLogger("slurm_robust.ckpt")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown tensor dtype {name!r} in a checkpoint")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def tensor_views(flat: torch.Tensor, specs: list[TensorSpec]) -> list[torch.Tensor]:
    """Typed views of ``flat`` (uint8) for each spec; no copy."""
    return [flat[s.offset:s.offset + s.nbytes].view(dtype_from_name(s.dtype)).reshape(s.shape)
            for s in specs]


class SlotBuffer:
    """One snapshot buffer: ``<base>.data`` mapped shared, plus its ``<base>.meta`` mark.

    The data file is fully allocated up front (posix_fallocate, so a full tmpfs fails
    here with ENOSPC instead of a SIGBUS in the middle of a copy) and touched once, so
    no step pays page faults. On CUDA it can be registered as pinned memory, which makes
    device-to-host copies into it asynchronous.
    """

    def __init__(self, base: Path, nbytes: int, pin: bool = False,
                 shared_root: Path | None = None) -> None:
        self.base = base
        self.nbytes = nbytes
        self.data_path = base.with_name(base.name + DATA_SUFFIX)
        self.meta_path = base.with_name(base.name + META_SUFFIX)
        ensure_dir(base.parent, shared_root if shared_root is not None else base.parent.parent)
        self.invalidate()
        fd = os.open(self.data_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                raise CheckpointError(
                    f"cannot allocate {nbytes} bytes for {self.data_path}: {exc}; free "
                    "space in the shared-memory root or lower the state size") from exc
        finally:
            os.close(fd)
        self.flat = torch.from_file(str(self.data_path), shared=True, size=nbytes,
                                    dtype=torch.uint8)
        self.flat.zero_()  # fault every page in now, not during a step
        self.pinned = False
        if pin and torch.cuda.is_available():
            self._pin()

    def _pin(self) -> None:
        rc = torch.cuda.cudart().cudaHostRegister(self.flat.data_ptr(), self.nbytes, 0)
        if int(rc) != 0:
            log.warning("cudaHostRegister of %s failed (%s); device copies will be "
                        "synchronous", self.data_path, rc)
            return
        self.pinned = True

    def numpy(self) -> np.ndarray:
        return self.flat.numpy()

    def invalidate(self) -> None:
        """Remove the completion mark before the buffer is rewritten."""
        try:
            os.unlink(self.meta_path)
        except FileNotFoundError:
            pass

    def release(self) -> None:
        """Unpin and unmap (the files stay: they are the memory tier)."""
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.flat.data_ptr())
            self.pinned = False
        self.flat = torch.empty(0, dtype=torch.uint8)

    def __repr__(self) -> str:
        return f"SlotBuffer({self.base}, {self.nbytes} bytes)"


def describe(header: dict[str, Any]) -> str:
    return (f"step {header.get('step')} rank {header.get('rank')} "
            f"({header.get('nbytes')} bytes)")
