"""Versioned JSON-lines records: the one format every journal and event log uses.

Every record is one JSON object on one line with at least::

    {"schema": "<kind>", "v": <int>, "time": <unix seconds, float>, ...}

The kinds and their fields are documented in ``docs/SCHEMAS.md``. Appends take an
exclusive ``flock`` on the file and write the whole line with one ``write`` call on an
``O_APPEND`` descriptor, so concurrent writers (several prologs on one node, many
ranks of one run) never interleave or tear lines. Readers count malformed lines
instead of failing or dropping them silently.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HEALTH_SCHEMA = "slurm_robust.health"
HEALTH_VERSION = 1
EVENT_SCHEMA = "slurm_robust.event"
EVENT_VERSION = 1
VERDICT_SCHEMA = "slurm_robust.verdict"
VERDICT_VERSION = 1
RESTART_REQUEST_SCHEMA = "slurm_robust.restart_request"
RESTART_REQUEST_VERSION = 1
TASK_EXIT_SCHEMA = "slurm_robust.task_exit"
TASK_EXIT_VERSION = 1

# Bounded so that one hostile or runaway record cannot fill a disk or a reader's memory.
MAX_LINE_BYTES = 1 << 20


class RecordError(ValueError):
    """A record could not be written: it is not JSON-serialisable or too large."""


def make_record(schema: str, version: int, fields: Mapping[str, Any],
                now: float | None = None) -> dict[str, Any]:
    """Return a record dict with the schema header first and ``time`` filled in."""
    record: dict[str, Any] = {"schema": schema, "v": version,
                              "time": time.time() if now is None else now}
    record.update(fields)
    return record


def encode_record(record: Mapping[str, Any]) -> bytes:
    """Encode one record as a single JSON line; raises RecordError if it cannot be."""
    try:
        line = json.dumps(record, separators=(",", ":"), sort_keys=False,
                          allow_nan=False, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"record is not JSON-serialisable: {exc}") from exc
    data = (line + "\n").encode()
    if len(data) > MAX_LINE_BYTES:
        raise RecordError(f"record is {len(data)} bytes, over the {MAX_LINE_BYTES}-byte limit")
    return data


def _json_default(obj: Any) -> Any:
    # Non-finite floats are refused by allow_nan=False; numpy scalars and paths are common.
    if isinstance(obj, Path):
        return str(obj)
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def append_records(path: str | os.PathLike[str], records: list[Mapping[str, Any]],
                   mode: int = 0o644) -> None:
    """Append records to a JSON-lines file under an exclusive lock, creating it if needed."""
    data = b"".join(encode_record(r) for r in records)
    if not data:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: a link planted at the journal's name must not redirect the appends.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def append_record(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append one record; see :func:`append_records`."""
    append_records(path, [record])


@dataclass
class ReadResult:
    """Records read from a JSON-lines file, and what could not be read."""

    records: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, raw line) from a file; a missing file yields nothing."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with fh:
        yield from enumerate(fh, 1)


def read_records(path: str | os.PathLike[str], schema: str | None = None) -> ReadResult:
    """Read every well-formed record (optionally of one schema) and count the rest.

    A torn last line (a writer killed mid-write) counts as malformed, like any
    other line that is not a JSON object with a ``schema`` field.
    """
    result = ReadResult()
    for lineno, raw in iter_lines(path):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or "schema" not in obj:
            result.malformed += 1
            if len(result.malformed_examples) < 5:
                result.malformed_examples.append(f"{path}:{lineno}")
            continue
        if schema is None or obj["schema"] == schema:
            result.records.append(obj)
    return result


def read_json_bounded(path: str | os.PathLike[str], max_bytes: int) -> Any:
    """The JSON value in ``path``, reading at most ``max_bytes`` (a file another program
    wrote may be anything). Raises OSError (missing, unreadable) or ValueError (larger
    than ``max_bytes``, not JSON)."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {max_bytes} bytes")
    return json.loads(data)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, mode: int = 0o644,
                      owner: int | None = None) -> None:
    """Write a JSON document atomically (see :func:`write_bytes_atomic`)."""
    data = json.dumps(obj, indent=2, sort_keys=True, default=_json_default).encode()
    write_bytes_atomic(path, [data], mode, owner=owner)


def write_bytes_atomic(path: str | os.PathLike[str], chunks: Iterable[bytes | memoryview],
                       mode: int = 0o644, durable: bool = True,
                       owner: int | None = None) -> None:
    """Write ``chunks`` to ``path`` atomically: a new temp file in the same directory,
    fsync (when ``durable``), rename over ``path``. The one atomic-write helper.

    The temp name is random and opened ``O_CREAT|O_EXCL|O_NOFOLLOW``: in a directory
    others can write to (``/tmp``, a 1777 state directory) a predictable name lets another
    user plant a symlink there (the write lands in a file of their choosing) or a FIFO
    (the open blocks forever). With O_EXCL nothing that exists is opened; the rename
    replaces a link at ``path`` itself, never its target. ``mode`` is subject to the
    umask, as for ``open``. ``owner``: the uid the file is given (``fchown`` on the temp
    file, before the rename) when root writes into a user's directory, so the user's
    readers, which accept only their own files, can read it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path, mode)
    try:
        try:
            if owner is not None and owner != os.geteuid():
                os.fchown(fd, owner, -1)
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view.nbytes:
                    view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _create_temp(path: Path, mode: int) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue  # 64 random bits taken: someone guessed; draw again
    raise FileExistsError(f"no free temp name next to {path} after 100 tries")
