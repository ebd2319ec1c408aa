"""The snapshot format: packed tensor bytes plus a meta file that marks completion.

A state is split into a *skeleton* (the nested dicts, lists and plain values, with every
tensor replaced by a :class:`TensorRef`) and the list of its tensors. The tensors are
packed into one flat byte buffer at 64-byte-aligned offsets (``.data``). The ``.meta``
file holds a JSON header (format, step, rank, world size, layout, byte count, checksum,
tensor table) and the skeleton as tagged JSON; it is written atomically *after* the
data, so its presence is the completion mark, and it is deleted *before* a buffer is
rewritten.

Nothing read back is executable: the skeleton is JSON with a closed set of tags (never
pickle), the header carries its own CRC32 and the skeleton's, and :func:`decode_meta`
validates every header field's type and range before anything uses it, so a damaged or
planted copy raises :class:`CorruptCopyError` and nothing else.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from slurm_robust.records import write_bytes_atomic
from slurm_robust.secure_fs import UnsafePathError, check_private

FORMAT = 2
ALIGN = 64
MAGIC = b"SRCKPT2\n"
_PREFIX = struct.Struct(">QI")  # header length, CRC32 of the header bytes
#: Bounds on what a meta file may claim, so a hostile one cannot make us allocate or
#: recurse without limit.
MAX_HEADER = 16 << 20
MAX_META = 64 << 20
MAX_DEPTH = 64
MAX_NBYTES = 1 << 44
CHECKSUM_ALGOS = ("crc32", "sum64")
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


# Below this many bytes per thread a split costs more than it saves.
_MIN_SPLIT_BYTES = 64 << 20
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="ckpt-sum64")
        return _pools[threads]


def _sum64(words: np.ndarray) -> int:
    return int(np.add.reduce(words, dtype=np.uint64)) if words.size else 0


def checksum(algo: str, data: np.ndarray | memoryview, threads: int = 1) -> int:
    """Checksum of a byte buffer whose length is a multiple of 8 (ALIGN guarantees it).

    ``threads`` > 1 splits a large sum64 over that many threads (numpy releases the GIL in
    the reduction, and a wrapping sum is the same in any grouping): one core sums about
    9 GB/s on an H200 node, too slow for a multi-GB state every step (gpu_check).
    crc32 is sequential and ignores it.
    """
    if algo == "crc32":
        # zlib releases the GIL on large buffers, so this overlaps training.
        return zlib.crc32(memoryview(data))
    if algo == "sum64":
        words = np.frombuffer(data, dtype=np.uint64)
        parts = min(threads, words.nbytes // _MIN_SPLIT_BYTES)
        if parts > 1:
            total = sum(_pool(parts).map(_sum64, np.array_split(words, parts)))
        else:
            total = _sum64(words)
        return (total + words.size) & 0xFFFFFFFFFFFFFFFF
    raise ValueError(f"unknown checksum {algo!r}")


def encode_skeleton(skeleton: Any) -> bytes:
    """The skeleton as tagged JSON: {"d": [[k, v]...]} dict, {"l": [...]} list,
    {"t": [...]} tuple, {"r": i} tensor ref, {"f": "nan"|"inf"|"-inf"} odd floats,
    {"b": hex} bytes, {"n": [dtype, shape, hex]} small numeric numpy arrays; str, int,
    finite float, bool and None as themselves.

    Raises:
        ValueError naming the type when a value has no safe encoding.
    """
    return json.dumps(_enc(skeleton, 0), separators=(",", ":"), allow_nan=False).encode()


def _enc(obj: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"checkpoint state nests deeper than {MAX_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if obj == obj and abs(obj) != float("inf") else {"f": repr(obj)}
    if isinstance(obj, TensorRef):
        return {"r": obj.index}
    if isinstance(obj, dict):
        return {"d": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in obj.items()]}
    if isinstance(obj, list):
        return {"l": [_enc(v, depth + 1) for v in obj]}
    if isinstance(obj, tuple):
        return {"t": [_enc(v, depth + 1) for v in obj]}
    if isinstance(obj, (bytes, bytearray)):
        return {"b": bytes(obj).hex()}
    if isinstance(obj, np.ndarray) and obj.dtype.kind in _ND_KINDS:
        # Small host arrays (numpy's RNG state); big ones belong in tensors.
        return {"n": [obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes().hex()]}
    if isinstance(obj, np.generic) and obj.dtype.kind in _ND_KINDS:
        return obj.item()
    raise ValueError(f"checkpoint state holds a {type(obj).__name__}, which has no safe "
                     "encoding; store tensors, numbers, strings, bytes, lists, tuples and "
                     "dicts of them")


_ND_KINDS = "biuf"
_FLOATS = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def decode_skeleton(raw: bytes, n_tensors: int, where: str) -> Any:
    """Inverse of :func:`encode_skeleton`; CorruptCopyError on anything else."""
    try:
        return _dec(json.loads(raw), 0, n_tensors)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise CorruptCopyError(f"{where}: skeleton is damaged: {exc}") from exc


def _dec(obj: Any, depth: int, n: int) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, int, str, float)):
        return obj
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError(f"unknown node {str(obj)[:60]!r}")
    (tag, val), = obj.items()
    if tag == "r" and type(val) is int and 0 <= val < n:
        return TensorRef(val)
    if tag == "f" and val in _FLOATS:
        return _FLOATS[val]
    if tag == "b" and isinstance(val, str):
        return bytes.fromhex(val)
    if tag == "n" and isinstance(val, list) and len(val) == 3:
        dtype = np.dtype(str(val[0]))
        if dtype.kind not in _ND_KINDS or not all(type(d) is int and d >= 0 for d in val[1]):
            raise ValueError(f"array of dtype {dtype} or shape {val[1]!r} is not allowed")
        return np.frombuffer(bytes.fromhex(val[2]), dtype=dtype).reshape(val[1]).copy()
    if tag in ("l", "t") and isinstance(val, list):
        items = [_dec(v, depth + 1, n) for v in val]
        return items if tag == "l" else tuple(items)
    if tag == "d" and isinstance(val, list):
        out = {}
        for pair in val:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("dict entry is not a pair")
            key = _dec(pair[0], depth + 1, n)
            if isinstance(key, (list, dict)):
                raise ValueError("unhashable dict key")
            out[key] = _dec(pair[1], depth + 1, n)
        return out
    raise ValueError(f"unknown tag {tag!r}")


def encode_meta(header: dict[str, Any], skel: bytes) -> bytes:
    """Serialise a header and an encoded skeleton; the skeleton's CRC goes into the
    header, the header's CRC in front of it."""
    head = dict(header, format=FORMAT, skeleton_len=len(skel),
                skeleton_crc32=zlib.crc32(skel))
    hbytes = json.dumps(head, sort_keys=True).encode()
    return MAGIC + _PREFIX.pack(len(hbytes), zlib.crc32(hbytes)) + hbytes + skel


def _is_int(v: Any, lo: int = 0, hi: int = MAX_NBYTES) -> bool:
    return type(v) is int and lo <= v <= hi


def validate_header(h: Any, where: str) -> dict[str, Any]:
    """Check every field restore uses; CorruptCopyError names the first bad one."""
    def bad(field: str) -> CorruptCopyError:
        return CorruptCopyError(f"{where}: header field {field!r} is missing or invalid")

    if not isinstance(h, dict):
        raise CorruptCopyError(f"{where}: header is not a JSON object")
    if h.get("format") != FORMAT:
        raise bad("format")
    for field, lo in (("step", 0), ("rank", 0), ("world_size", 1), ("nbytes", 0),
                      ("checksum", 0), ("skeleton_len", 0), ("skeleton_crc32", 0)):
        if not _is_int(h.get(field), lo, 1 << 64):
            raise bad(field)
    if h["nbytes"] > MAX_NBYTES:
        raise bad("nbytes")
    if h.get("checksum_algo") not in CHECKSUM_ALGOS:
        raise bad("checksum_algo")
    if not isinstance(h.get("layout"), dict):
        raise bad("layout")
    tensors = h.get("tensors")
    if not isinstance(tensors, list):
        raise bad("tensors")
    for t in tensors:
        if not (isinstance(t, list) and len(t) == 4 and isinstance(t[0], str)
                and isinstance(t[1], list) and all(_is_int(d) for d in t[1])
                and _is_int(t[2]) and _is_int(t[3]) and t[2] + t[3] <= h["nbytes"]
                and t[2] % 8 == 0):
            raise bad("tensors")
        count = 1
        for d in t[1]:
            count *= d
        if count * _itemsize(t[0], where) != t[3]:
            raise bad("tensors")
    return h


def _itemsize(dtype: str, where: str) -> int:
    import torch  # the skeleton format is torch's; imported late like the rest of ckpt

    dt = getattr(torch, dtype, None) if dtype.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise CorruptCopyError(f"{where}: unknown tensor dtype {dtype!r}")
    return dt.itemsize


def decode_meta(raw: bytes, where: str = "meta") -> tuple[dict[str, Any], Any]:
    """Parse :func:`encode_meta` output; raise CorruptCopyError (only) on any damage."""
    start = len(MAGIC) + _PREFIX.size
    if not raw.startswith(MAGIC) or len(raw) < start:
        raise CorruptCopyError(f"{where}: not a checkpoint meta file of format {FORMAT} "
                               "(bad magic)")
    hlen, hcrc = _PREFIX.unpack_from(raw, len(MAGIC))
    hbytes = raw[start:start + hlen]
    if hlen > MAX_HEADER or len(hbytes) != hlen or zlib.crc32(hbytes) != hcrc:
        raise CorruptCopyError(f"{where}: header damaged (length or CRC32)")
    try:
        header = json.loads(hbytes)
    except (ValueError, RecursionError) as exc:
        raise CorruptCopyError(f"{where}: header is not JSON: {exc}") from exc
    validate_header(header, where)
    skel = raw[start + hlen:]
    if len(skel) != header["skeleton_len"] or zlib.crc32(skel) != header["skeleton_crc32"]:
        raise CorruptCopyError(f"{where}: skeleton damaged (length or CRC32)")
    return header, decode_skeleton(skel, len(header["tensors"]), where)


def write_file_atomic(path: Path, chunks: list[memoryview | bytes], durable: bool) -> None:
    """Write ``chunks`` to ``path`` via a random O_EXCL|O_NOFOLLOW temp file and rename;
    fsync when ``durable`` (records.write_bytes_atomic)."""
    write_bytes_atomic(path, chunks, 0o600, durable=durable)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(base: Path) -> tuple[dict[str, Any], Any]:
    """Read ``<base>.meta``; raise CorruptCopyError (or FileNotFoundError if absent)."""
    meta = base.with_name(base.name + META_SUFFIX)
    fd = open_copy_file(meta)
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_META + 1)
    if len(raw) > MAX_META:
        raise CorruptCopyError(f"{meta}: over {MAX_META} bytes")
    return decode_meta(raw, str(meta))


def open_copy_file(path: Path) -> int:
    """Open a copy's file read-only without following a link; it must be a regular
    file of ours that others cannot write (else CorruptCopyError: it is skipped)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptCopyError(f"{path}: is a symlink (planted?); not followed") from exc
        raise
    try:
        check_private(os.fstat(fd), str(path), want_dir=False)
    except UnsafePathError as exc:
        os.close(fd)
        raise CorruptCopyError(str(exc)) from exc
    return fd


def read_data_into(base: Path, header: dict[str, Any], out: np.ndarray) -> None:
    """Read ``<base>.data`` into ``out`` (uint8, header['nbytes'] long) and verify it."""
    path = base.with_name(base.name + DATA_SUFFIX)
    nbytes = int(header["nbytes"])
    if out.nbytes != nbytes:
        raise ValueError(f"buffer of {out.nbytes} bytes for a {nbytes}-byte copy")
    with os.fdopen(open_copy_file(path), "rb", buffering=0) as fh:
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
