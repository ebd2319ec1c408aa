"""Verdicts: where a job leaves them, and how the privileged side reads them safely.

A job (unprivileged) blames one of its nodes by appending a ``slurm_robust.verdict``
record to ``<verdict_dir>/<user>/<job_id>.jsonl`` (:func:`write_verdict`). EpilogSlurmctld
(root/SlurmUser) reads that file at job end (:func:`read_job_verdicts`) and treats it as
hostile: the user directory and the file must be owned by the job's user, the directory
not writable by others, the file a regular file reached without following symlinks and
no larger than a cap; every record must name this job and a node of its allocation.
``verdict_dir`` itself is root-owned with mode 1777 (like /tmp), created by
:func:`ensure_verdict_root`.

Why a spool directory and not the job's run directory: EpilogSlurmctld does not see the
job's environment, and finding the run directory would cost a Slurm call on every job
end; here a job without verdicts costs one failed ``open``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.records import (
    VERDICT_SCHEMA,
    VERDICT_VERSION,
    append_record,
    append_records,
    make_record,
)
from slurm_robust.slurm import check_job_id, check_node_name, clean_reason

_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
DONE_SUFFIX = ".done"


class VerdictError(SlurmRobustError):
    """A verdict could not be written (bad spool directory, bad input)."""


def check_user_name(user: str) -> str:
    """Return ``user`` if it is a plain account name usable as one path component."""
    if not _USER.match(user or "") or user in (".", ".."):
        raise UsageError(f"{user!r} is not a valid user name")
    return user


def verdict_path(verdict_root: Path, user: str, job_id: str | int) -> Path:
    """``<verdict_root>/<user>/<job_id>.jsonl``: where job ``job_id`` of ``user`` writes."""
    return verdict_root / check_user_name(user) / f"{check_job_id(job_id)}.jsonl"


def ensure_verdict_root(verdict_root: Path) -> None:
    """Create the spool directory root-owned with mode 1777 (sticky, like /tmp)."""
    verdict_root.mkdir(parents=True, exist_ok=True)
    st = os.lstat(verdict_root)
    if not stat.S_ISDIR(st.st_mode):
        raise VerdictError(f"verdict_dir {verdict_root} is not a directory (a symlink?); "
                           "remove it and rerun `slurm-robust reserve reconcile`")
    if stat.S_IMODE(st.st_mode) != 0o1777:
        os.chmod(verdict_root, 0o1777)


def write_verdict(verdict_root: Path, user: str, job_id: str | int, node: str, reason: str,
                  cls: str, evidence: Mapping[str, Any] | None = None,
                  incident: str = "", run_dir: Path | None = None,
                  now: float | None = None) -> Path:
    """Append one verdict where EpilogSlurmctld will read it (and to ``run_dir``'s copy).

    Called by the job (the launcher) as the job's user. Creates ``<verdict_root>/<user>``
    with mode 0700 when missing.

    Raises:
        VerdictError: the spool directory is missing or the user directory is not ours.
        UsageError: bad user, job id or node name.
    """
    path = verdict_path(verdict_root, user, job_id)
    if not verdict_root.is_dir():
        raise VerdictError(f"verdict_dir {verdict_root} does not exist; an admin creates it "
                           "with `slurm-robust reserve reconcile` (or mkdir -m 1777)")
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise VerdictError(f"cannot create {path.parent}: {exc}") from exc
    st = os.lstat(path.parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise VerdictError(f"{path.parent} is not a directory owned by uid {os.geteuid()}; "
                           "ask an admin to remove it")
    record = make_record(VERDICT_SCHEMA, VERDICT_VERSION, {
        "job_id": check_job_id(job_id), "node": check_node_name(node),
        "reason": clean_reason(reason), "class": cls, "evidence": dict(evidence or {}),
        "incident": incident}, now=now)
    append_records(path, [record], mode=0o600)
    if run_dir is not None:
        append_record(Path(run_dir) / "verdicts.jsonl", record)
    return path


@dataclass(frozen=True)
class Verdict:
    """A validated verdict: this job blames this node of its allocation."""

    job_id: str
    node: str
    reason: str
    cls: str
    incident: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Refusal:
    """A verdict (or a whole file) that was not applied, and why."""

    why: str
    node: str | None = None
    excerpt: str = ""


@dataclass
class VerdictBatch:
    """What one job's verdict file yielded."""

    path: Path
    verdicts: list[Verdict] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    done_name: str | None = None  # what the file was renamed to once read


def parse_verdicts(data: bytes, job_id: str, job_nodes: Collection[str],
                   max_records: int) -> tuple[list[Verdict], list[Refusal]]:
    """Validate raw verdict-file bytes against the job (pure).

    A record is applied only when it is a ``slurm_robust.verdict`` object whose ``job_id``
    is this job and whose ``node`` is in ``job_nodes``; one verdict per node is kept (the
    first). Everything else becomes a Refusal naming the reason.
    """
    verdicts: list[Verdict] = []
    refusals: list[Refusal] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        excerpt = raw[:200].decode("utf-8", "replace")
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            # RecursionError: a record nested deeper than the interpreter's stack (a
            # hostile file; issue 12 finding 8) is refused like any other non-record.
            refusals.append(Refusal(f"line {lineno}: not JSON (or nested too deep)", None,
                                    excerpt))
            continue
        why, verdict = _validate(obj, job_id, job_nodes)
        if verdict is None:
            node = obj.get("node") if isinstance(obj, dict) else None
            refusals.append(Refusal(f"line {lineno}: {why}",
                                    node if isinstance(node, str) else None, excerpt))
        elif verdict.node in seen:
            continue  # a repeated blame of the same node changes nothing
        elif len(verdicts) >= max_records:
            refusals.append(Refusal(f"line {lineno}: over the limit of {max_records} "
                                    "verdicts per job", verdict.node, excerpt))
        else:
            seen.add(verdict.node)
            verdicts.append(verdict)
    return verdicts, refusals


def _validate(obj: Any, job_id: str, job_nodes: Collection[str]) -> tuple[str, Verdict | None]:
    if not isinstance(obj, dict) or obj.get("schema") != VERDICT_SCHEMA:
        return f"not a {VERDICT_SCHEMA} record", None
    node, reason = obj.get("node"), obj.get("reason")
    if str(obj.get("job_id")) != job_id:
        return f"job_id {obj.get('job_id')!r} is not this job ({job_id})", None
    if not isinstance(node, str) or not node:
        return "node missing", None
    if node not in job_nodes:
        return f"node {node!r} is not in job {job_id}'s allocation", None
    if not isinstance(reason, str) or not reason.strip():
        return "reason missing", None
    evidence = obj.get("evidence")
    if not isinstance(evidence, dict) or not _small(evidence, EVIDENCE_DEPTH):
        evidence = {}  # too deep or too big to carry into root-written records
    return "", Verdict(job_id, node, clean_reason(reason),
                       str(obj.get("class") or "unknown")[:64],
                       str(obj.get("incident") or "")[:64], evidence)


#: Bounds on the evidence a verdict may carry into the records root writes.
EVIDENCE_DEPTH = 6
EVIDENCE_ITEMS = 256


def _small(obj: Any, depth: int, budget: list[int] | None = None) -> bool:
    """Whether ``obj`` nests at most ``depth`` levels and holds few enough items."""
    budget = budget if budget is not None else [EVIDENCE_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth < 0:
        return False
    if isinstance(obj, dict):
        return all(_small(v, depth - 1, budget) for v in obj.values())
    if isinstance(obj, list):
        return all(_small(v, depth - 1, budget) for v in obj)
    return True


def read_job_verdicts(verdict_root: Path, user: str, uid: int, job_id: str,
                      job_nodes: Collection[str], max_bytes: int, max_records: int,
                      restart_count: int = 0) -> VerdictBatch | None:
    """Read and validate job ``job_id``'s verdict file; None when it has none (fast path).

    Never follows a symlink, never blocks on a FIFO, never reads more than ``max_bytes``.
    A file that fails the ownership/type/size checks yields a batch with one Refusal.
    A regular file that was read is renamed to ``<job_id>.<restart_count>.done`` in the
    same directory (through the directory's descriptor, so a swapped directory cannot
    redirect the rename), so the next end of the same job does not apply it again.
    """
    path = verdict_path(verdict_root, user, job_id)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return VerdictBatch(path, refusals=[Refusal(f"{path.parent} is not a directory")])
        raise
    try:
        return _read_in_dir(dir_fd, path, uid, job_id, job_nodes, max_bytes, max_records,
                            restart_count)
    finally:
        os.close(dir_fd)


def _read_in_dir(dir_fd: int, path: Path, uid: int, job_id: str, job_nodes: Collection[str],
                 max_bytes: int, max_records: int, restart_count: int) -> VerdictBatch | None:
    batch = VerdictBatch(path)
    dst = os.fstat(dir_fd)
    if dst.st_uid != uid or dst.st_mode & 0o022:
        batch.refusals.append(Refusal(f"{path.parent} must be owned by uid {uid} and not "
                                      f"writable by others (uid {dst.st_uid}, "
                                      f"mode {stat.S_IMODE(dst.st_mode):o})"))
        return batch
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        batch.refusals.append(Refusal(f"{path} cannot be opened safely: {exc.strerror}"))
        return batch
    try:
        st = os.fstat(fd)
        why = _file_problem(st, uid, max_bytes)
        data = b"" if why else os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
        done = f"{path.stem}.{restart_count}{DONE_SUFFIX}"
        os.rename(path.name, done, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        batch.done_name = done
    if why:
        batch.refusals.append(Refusal(f"{path}: {why}"))
        return batch
    batch.verdicts, batch.refusals = parse_verdicts(data[:max_bytes], job_id, job_nodes,
                                                    max_records)
    return batch


def _file_problem(st: os.stat_result, uid: int, max_bytes: int) -> str:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not the job's user (uid {uid})"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links"
    if st.st_size > max_bytes:
        return f"{st.st_size} bytes, over the {max_bytes}-byte limit"
    return ""


def restore_verdicts(batch: VerdictBatch) -> bool:
    """Put a read verdict file back (after applying it failed), so the next job end retries.

    Goes through the directory's descriptor (no symlink followed) and never replaces a
    verdict file the job has written since. Returns whether the file was put back.
    """
    if batch.done_name is None:
        return False
    try:
        dir_fd = os.open(batch.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        try:
            os.stat(batch.path.name, dir_fd=dir_fd, follow_symlinks=False)
            return False  # a newer file is there: keep it, the old verdicts stay .done
        except FileNotFoundError:
            pass
        os.rename(batch.done_name, batch.path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)
