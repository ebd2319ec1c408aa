"""Verdicts: where a job leaves them, and how the privileged side reads them safely.

A job (unprivileged) blames one of its nodes by appending a ``slurm_robust.verdict``
record to ``<verdict_dir>/<user>/<job_id>.jsonl`` (:func:`write_verdict`). EpilogSlurmctld
(root/SlurmUser) reads that file at job end (:func:`read_job_verdicts`) and treats it as
hostile: the user directory and the file must be owned by the job's user, the directory
not writable by others, the file a regular file reached without following symlinks and
no larger than a cap; every record must name this job and a node of its allocation.

Who may create what: ``verdict_dir`` is owned by root and SlurmUser's
group, mode 0755 (:func:`ensure_verdict_root`), so no user can create a directory in it,
and so none can pre-create another user's. ``<verdict_dir>/<user>`` is made by the root
node Prolog at the user's job start (:func:`ensure_user_spool`): owned by the user, group
SlurmUser's, mode 2770, so the job writes there, SlurmUser (not root on real sites) reads
and renames the files, and other users can neither list nor write. A directory found with
another owner (left from an older, world-writable spool) is moved aside by the Prolog.

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
    RESTART_REQUEST_SCHEMA,
    RESTART_REQUEST_VERSION,
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


ROOT_MODE = 0o755
USER_SPOOL_MODE = 0o2770
# A verdict file: the job's user writes, SlurmUser's group (inherited from the setgid
# user directory) reads.
FILE_MODE = 0o640


def ensure_verdict_root(verdict_root: Path, gid: int | None = None) -> None:
    """Create the spool directory owned by root (group ``gid``: SlurmUser's), mode 0755.

    Run as root. Users cannot create anything in it; their directories come from
    :func:`ensure_user_spool` (the node Prolog).
    """
    verdict_root.mkdir(parents=True, exist_ok=True)
    st = os.lstat(verdict_root)
    if not stat.S_ISDIR(st.st_mode):
        raise VerdictError(f"verdict_dir {verdict_root} is not a directory (a symlink?); "
                           "remove it and rerun `slurm-robust reserve reconcile`")
    if gid is not None and (st.st_uid, st.st_gid) != (0, gid):
        os.chown(verdict_root, 0, gid, follow_symlinks=False)
    if stat.S_IMODE(st.st_mode) != ROOT_MODE:
        os.chmod(verdict_root, ROOT_MODE)


def ensure_user_spool(verdict_root: Path, user: str, uid: int) -> str:
    """Make ``<verdict_root>/<user>`` the user's spool (root only; the node Prolog).

    Owned by ``uid``, group of ``verdict_root`` (SlurmUser's), mode 2770. Walks from the
    root's descriptor without following links. Returns what was done: ``ok`` (already
    right), ``created``, or ``replaced`` (a directory or file of another owner was moved
    aside to ``.squatted.<user>.<inode>`` and a right one made).

    Raises:
        VerdictError: ``verdict_root`` is missing or not a directory.
    """
    name = check_user_name(user)
    try:
        root_fd = os.open(verdict_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise VerdictError(f"verdict_dir {verdict_root} cannot be opened as a directory: "
                           f"{exc.strerror}; an admin creates it (slurm-robust reserve "
                           "reconcile)") from exc
    try:
        gid = os.fstat(root_fd).st_gid
        done = "created"
        try:
            st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None:
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                _fix_spool(root_fd, name, uid, gid)
                return "ok"
            os.rename(name, f".squatted.{name}.{st.st_ino}", src_dir_fd=root_fd,
                      dst_dir_fd=root_fd)
            done = "replaced"
        os.mkdir(name, 0o700, dir_fd=root_fd)
        _fix_spool(root_fd, name, uid, gid)
        return done
    finally:
        os.close(root_fd)


def _fix_spool(root_fd: int, name: str, uid: int, gid: int) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
        if stat.S_IMODE(st.st_mode) != USER_SPOOL_MODE:
            os.fchmod(fd, USER_SPOOL_MODE)
    finally:
        os.close(fd)


def write_verdict(verdict_root: Path, user: str, job_id: str | int, node: str, reason: str,
                  cls: str, evidence: Mapping[str, Any] | None = None,
                  incident: str = "", run_dir: Path | None = None,
                  now: float | None = None) -> Path:
    """Append one verdict where EpilogSlurmctld will read it (and to ``run_dir``'s copy).

    Called by the job (the launcher) as the job's user. ``<verdict_root>/<user>`` is made
    by the node Prolog (:func:`ensure_user_spool`); where the root is still world-writable
    (an older spool), a missing one is created here.

    Raises:
        VerdictError: the spool directory is missing or the user directory is not ours.
        UsageError: bad user, job id or node name.
    """
    path = _spool_file(verdict_root, user, job_id)
    record = make_record(VERDICT_SCHEMA, VERDICT_VERSION, {
        "job_id": check_job_id(job_id), "node": check_node_name(node),
        "reason": clean_reason(reason), "class": cls, "evidence": dict(evidence or {}),
        "incident": incident}, now=now)
    append_records(path, [record], mode=FILE_MODE)
    if run_dir is not None:
        append_record(Path(run_dir) / "verdicts.jsonl", record)
    return path


def write_restart_request(verdict_root: Path, user: str, job_id: str | int, why: str,
                          now: float | None = None) -> Path:
    """Ask EpilogSlurmctld to start the job again at once after the requeue the job is
    about to make (a ``slurm_robust.restart_request`` in the verdict file).

    Slurm holds a requeued job for its credential lifetime (120 s by default) and undoes
    a StartTime reset made while the job completes; the job's own processes are gone by
    the time it is pending again, so the reset has to come from EpilogSlurmctld. A job
    with verdicts gets it anyway; this is for a requeue that blames no node (a time
    limit, a shortfall). The request can only restart the job that wrote it, which its
    user may do anyway. Raises as :func:`write_verdict`.
    """
    path = _spool_file(verdict_root, user, job_id)
    append_records(path, [make_record(RESTART_REQUEST_SCHEMA, RESTART_REQUEST_VERSION, {
        "job_id": check_job_id(job_id), "why": clean_reason(why)}, now=now)], mode=FILE_MODE)
    return path


def _spool_file(verdict_root: Path, user: str, job_id: str | int) -> Path:
    """The job's verdict file, its user directory made if the root still allows it."""
    path = verdict_path(verdict_root, user, job_id)
    if not verdict_root.is_dir():
        raise VerdictError(f"verdict_dir {verdict_root} does not exist; an admin creates it "
                           "with `slurm-robust reserve reconcile` (or mkdir -m 1777)")
    try:
        path.parent.mkdir(mode=0o750, exist_ok=True)
    except OSError as exc:
        raise VerdictError(f"cannot create {path.parent}: {exc.strerror}; the node prolog "
                           "creates it at job start (is it configured?)") from exc
    st = os.lstat(path.parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise VerdictError(f"{path.parent} is not a directory owned by uid {os.geteuid()}; "
                           "ask an admin to remove it")
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
    #: The job asked to be started again at once after its requeue.
    restart_requested: bool = False


def parse_verdicts(data: bytes, job_id: str, job_nodes: Collection[str],
                   max_records: int) -> tuple[list[Verdict], list[Refusal]]:
    """Validate raw verdict-file bytes against the job (pure).

    A record is applied only when it is a ``slurm_robust.verdict`` object whose ``job_id``
    is this job and whose ``node`` is in ``job_nodes``; one verdict per node is kept (the
    first). A ``slurm_robust.restart_request`` for this job is no verdict and no refusal
    (:func:`parse_verdict_file` reports it). Everything else becomes a Refusal naming the
    reason.
    """
    verdicts, refusals, _ = parse_verdict_file(data, job_id, job_nodes, max_records)
    return verdicts, refusals


def parse_verdict_file(data: bytes, job_id: str, job_nodes: Collection[str],
                       max_records: int) -> tuple[list[Verdict], list[Refusal], bool]:
    """:func:`parse_verdicts`, and whether the file holds a restart request of this job."""
    verdicts: list[Verdict] = []
    refusals: list[Refusal] = []
    seen: set[str] = set()
    restart = False
    for lineno, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        excerpt = raw[:200].decode("utf-8", "replace")
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            # RecursionError: a record nested deeper than the interpreter's stack (a
            # hostile file) is refused like any other non-record.
            refusals.append(Refusal(f"line {lineno}: not JSON (or nested too deep)", None,
                                    excerpt))
            continue
        if isinstance(obj, dict) and obj.get("schema") == RESTART_REQUEST_SCHEMA:
            if str(obj.get("job_id")) == job_id:
                restart = True
            else:
                refusals.append(Refusal(f"line {lineno}: restart request for job_id "
                                        f"{obj.get('job_id')!r}, not this job ({job_id})",
                                        None, excerpt))
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
    return verdicts, refusals, restart


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
        root_gid = os.stat(verdict_root).st_gid
        return _read_in_dir(dir_fd, path, uid, job_id, job_nodes, max_bytes, max_records,
                            restart_count, root_gid)
    finally:
        os.close(dir_fd)


def _read_in_dir(dir_fd: int, path: Path, uid: int, job_id: str, job_nodes: Collection[str],
                 max_bytes: int, max_records: int, restart_count: int,
                 root_gid: int) -> VerdictBatch | None:
    batch = VerdictBatch(path)
    dst = os.fstat(dir_fd)
    # Group write is SlurmUser's (the reader's) group from ensure_user_spool; any other
    # group able to write could plant files, as could "others".
    group_ok = not dst.st_mode & 0o020 or dst.st_gid == root_gid
    if dst.st_uid != uid or dst.st_mode & 0o002 or not group_ok:
        batch.refusals.append(Refusal(f"{path.parent} must be owned by uid {uid} and "
                                      f"writable only by it and SlurmUser's group "
                                      f"(uid {dst.st_uid}, gid {dst.st_gid}, "
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
    batch.verdicts, batch.refusals, batch.restart_requested = parse_verdict_file(
        data[:max_bytes], job_id, job_nodes, max_records)
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
