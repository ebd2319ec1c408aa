"""The snapshot format: packed tensor bytes plus a meta file that marks completion.

A state is split into a *skeleton* (the nested dicts, lists and plain values, with every
tensor replaced by a :class:`TensorRef`) and the list of its tensors. The tensors are
packed into one flat byte buffer at 64-byte-aligned offsets (``.data``). The ``.meta``
file holds a JSON header (format, step, rank, world size, layout, byte count, checksum,
tensor table) and the pickled skeleton; it is written atomically *after* the data, so
its presence is the completion mark, and it is deleted *before* a buffer is rewritten.

The skeleton is read with pickle: the files live in directories created mode 0700 for
the job's user, so only that user can plant one.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1
ALIGN = 64
MAGIC = b"SRCKPT1\n"
_LEN = struct.Struct(">Q")
DATA_SUFFIX = ".data"
META_SUFFIX = ".meta"


class CorruptCopyError(Exception):
    """A copy is torn, truncated or fails its checksum; it must never be loaded."""


@dataclass(frozen=True)
class TensorRef:
    """Stands in for tensor ``index`` of the flat buffer inside a skeleton."""

    index: int


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives in the flat buffer."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def flatten(state: Any, tensor_type: type) -> tuple[Any, list[Any]]:
    """Split ``state`` into a skeleton and its tensors (instances of ``tensor_type``)."""
    tensors: list[Any] = []

    def leaf(obj: Any) -> Any:
        if isinstance(obj, tensor_type):
            tensors.append(obj)
            return TensorRef(len(tensors) - 1)
        return obj

    return _map_leaves(state, leaf), tensors


def unflatten(skeleton: Any, tensors: list[Any]) -> Any:
    """Inverse of :func:`flatten`."""
    return _map_leaves(skeleton,
                       lambda obj: tensors[obj.index] if isinstance(obj, TensorRef) else obj)


def _map_leaves(obj: Any, leaf: Any) -> Any:
    """Rebuild dicts, lists and plain tuples with ``leaf`` applied to everything else."""
    if isinstance(obj, dict):
        return type(obj)((k, _map_leaves(v, leaf)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_map_leaves(v, leaf) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_map_leaves(v, leaf) for v in obj)
    return leaf(obj)


def pack_layout(items: list[tuple[str, tuple[int, ...], int]]) -> tuple[list[TensorSpec], int]:
    """Place tensors given as (dtype name, shape, byte count); return specs and total size."""
    specs, offset = [], 0
    for dtype, shape, nbytes in items:
        specs.append(TensorSpec(dtype, tuple(shape), offset, nbytes))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return specs, max(offset, ALIGN)


def checksum(algo: str, data: np.ndarray | memoryview) -> int:
    """Checksum of a byte buffer whose length is a multiple of 8 (ALIGN guarantees it)."""
    if algo == "crc32":
        # zlib releases the GIL on large buffers, so this overlaps training.
        return zlib.crc32(memoryview(data))
    if algo == "sum64":
        words = np.frombuffer(data, dtype=np.uint64)
        total = int(np.add.reduce(words, dtype=np.uint64)) if words.size else 0
        return (total + words.size) & 0xFFFFFFFFFFFFFFFF
    raise ValueError(f"unknown checksum {algo!r}")


def pickle_skeleton(skeleton: Any) -> bytes:
    return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)


def encode_meta(header: dict[str, Any], skel: bytes) -> bytes:
    """Serialise a header and a pickled skeleton; the skeleton's CRC goes into the header."""
    head = dict(header, skeleton_len=len(skel), skeleton_crc32=zlib.crc32(skel))
    hbytes = json.dumps(head, sort_keys=True).encode()
    return MAGIC + _LEN.pack(len(hbytes)) + hbytes + skel


def decode_meta(raw: bytes, where: str = "meta") -> tuple[dict[str, Any], Any]:
    """Parse :func:`encode_meta` output; raise CorruptCopyError on any damage."""
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + _LEN.size:
        raise CorruptCopyError(f"{where}: not a checkpoint meta file (bad magic)")
    (hlen,) = _LEN.unpack_from(raw, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    try:
        header = json.loads(raw[start:start + hlen])
    except ValueError as exc:
        raise CorruptCopyError(f"{where}: header is not JSON: {exc}") from exc
    skel = raw[start + hlen:]
    if (not isinstance(header, dict) or header.get("format") != FORMAT
            or len(skel) != header.get("skeleton_len")
            or zlib.crc32(skel) != header.get("skeleton_crc32")):
        raise CorruptCopyError(f"{where}: header or skeleton damaged")
    try:
        skeleton = pickle.loads(skel)
    except Exception as exc:  # any unpickling failure means a damaged copy
        raise CorruptCopyError(f"{where}: skeleton does not unpickle: {exc}") from exc
    return header, skeleton


def write_file_atomic(path: Path, chunks: list[memoryview | bytes], durable: bool) -> None:
    """Write ``chunks`` to ``path`` via a temp file and rename; fsync when ``durable``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view.nbytes:
                view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(base: Path) -> tuple[dict[str, Any], Any]:
    """Read ``<base>.meta``; raise CorruptCopyError (or FileNotFoundError if absent)."""
    meta = base.with_name(base.name + META_SUFFIX)
    return decode_meta(meta.read_bytes(), str(meta))


def read_data_into(base: Path, header: dict[str, Any], out: np.ndarray) -> None:
    """Read ``<base>.data`` into ``out`` (uint8, header['nbytes'] long) and verify it."""
    path = base.with_name(base.name + DATA_SUFFIX)
    nbytes = int(header["nbytes"])
    if out.nbytes != nbytes:
        raise ValueError(f"buffer of {out.nbytes} bytes for a {nbytes}-byte copy")
    with open(path, "rb", buffering=0) as fh:
        if os.fstat(fh.fileno()).st_size < nbytes:
            raise CorruptCopyError(f"{path}: truncated (under {nbytes} bytes)")
        view, got = memoryview(out), 0
        while got < nbytes:
            n = fh.readinto(view[got:])
            if not n:
                raise CorruptCopyError(f"{path}: truncated at {got} of {nbytes} bytes")
            got += n
    verify(header, out, str(path))


def verify(header: dict[str, Any], data: np.ndarray, where: str) -> None:
    """Raise CorruptCopyError unless ``data`` matches the header's checksum."""
    got = checksum(header["checksum_algo"], data)
    if got != header["checksum"]:
        raise CorruptCopyError(f"{where}: checksum {got:#x} != recorded "
                               f"{header['checksum']:#x} (step {header.get('step')})")
