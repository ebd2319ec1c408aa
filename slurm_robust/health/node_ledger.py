"""The node ledger: every node's verdicts, check failures, drains, returns to service,
deep checks and blames, across jobs, in one SQLite database.

The per-job files (health journals, the verdict log, the reserve log) each see one job or
one node; a node that fails a little for every job (a lemon) only shows across them. So
the paths that already decide about nodes (the prolog/epilog, EpilogSlurmctld's verdicts,
the deep check, the breaker's held-back drains) also append one row here, and the lemon
score (health/lemons.py) reads it.

Storage: ``<ledger.dir>/nodes.sqlite3``, the directory owned by root (or the writer) and
closed to others, like the breaker's: mode 0700, or 2770 when it is made inside a setgid
directory of SlurmUser's group (the reserve's log directory), so that EpilogSlurmctld
(SlurmUser) and root's programs share it. No user can read the history, hold its lock or
plant a file there. SQLite in WAL mode
(readers never block the writer), a busy timeout of ``busy_timeout_s``, and one writer at
a time: every write is one ``BEGIN IMMEDIATE`` transaction, which takes the write lock
up front (a deferred one could fail half-way when another writer got there first).
WAL needs memory shared between the processes that open the database, so the directory
must be on a local filesystem of one host, not NFS (docs/ADMIN_GUIDE.md).

Everything a job controls (a verdict's reason, class and evidence) is hostile: node
names and job ids are validated, text is cut to bounded printable lines, evidence is
JSON text of at most ``evidence_max_bytes``, and every statement is parameterised.

Recording is bookkeeping: :meth:`NodeLedger.record` raises :class:`LedgerUnavailable`
and the writers (health/ledger_writer.py) log it and go on; a node's drain never waits
for, or fails because of, this database.

Schema version: ``PRAGMA user_version`` (LEDGER_VERSION); :data:`MIGRATIONS` takes a
database from any older version to this one, in order, each step in one transaction. A
database newer than this code is refused (an older slurm_robust must not write into it).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.slurm import check_job_id, check_node_name

DB_FILE = "nodes.sqlite3"
#: Bounds on what a row may hold (job-controlled text is cut, never refused whole).
TEXT_LIMIT = 300
NAME_LIMIT = 64


class LedgerUnavailable(SlurmRobustError):
    """The ledger cannot be used here (unsafe directory, locked, broken, too new)."""


class EventKind(StrEnum):
    """What happened to a node (the ``kind`` column).

    BLAME: a job's verdict named the node (EpilogSlurmctld), or Slurm marked it DOWN
        under the job. Counted per distinct job by the lemon score.
    CHECK_FAILED: a node check failed in the prolog or epilog.
    DRAIN: slurm_robust drained the node (reason in the evidence).
    WOULD_DRAIN: the drain circuit breaker held a drain back; the node kept running.
    DEEP_CHECK_PASSED / DEEP_CHECK_FAILED: the deep suite on a pending node.
    RETURNED: the node was resumed after a passed deep check (back in service).
    REPAIR: a step of the break-fix loop (health/repair.py): a reboot issued, or the
        next round started after a failed one (the round and step in the evidence).
    PARDON: an admin cleared the node's record for the lemon score (after a repair).
    """

    BLAME = "blame"
    CHECK_FAILED = "check_failed"
    DRAIN = "drain"
    WOULD_DRAIN = "would_drain"
    DEEP_CHECK_PASSED = "deep_check_passed"
    DEEP_CHECK_FAILED = "deep_check_failed"
    RETURNED = "returned"
    REPAIR = "repair"
    PARDON = "pardon"


@dataclass(frozen=True)
class LedgerConfig:
    """Site config ``ledger`` (all optional); the lemon keys are read by health/lemons.py.

    Attributes:
        enabled: record at all (false: the writers do nothing, the consumers see no lemons).
        dir: the root-only directory of the database (a local filesystem, see above).
        busy_timeout_s: how long a writer waits for another's lock before giving up
            (kept short: a prolog must not wait on bookkeeping).
        evidence_max_bytes: evidence JSON larger than this is replaced by an excerpt.
        retain_days: rows older than this are deleted by the writes (bounded size).
        lemon_blames: distinct jobs whose blame makes a node a lemon (within the window).
        lemon_deep_failures: failed deep checks that make a node a lemon (in the window).
        lemon_window_days: the window both counts look back over.
        lemons_file: world-readable list of the lemons (names only), written by the
            writers, read by ``slurm-robust submit`` (a user cannot read the database);
            null: ``<dir>/../lemons.json``.
    """

    enabled: bool = True
    dir: str = "/var/lib/slurm_robust/ledger"
    busy_timeout_s: float = 2.0
    evidence_max_bytes: int = 4096
    retain_days: float = 365.0
    lemon_blames: int = 3
    lemon_deep_failures: int = 2
    lemon_window_days: float = 30.0
    lemons_file: str | None = None

    @property
    def db_path(self) -> Path:
        return Path(self.dir) / DB_FILE

    @property
    def lemons_path(self) -> Path:
        return Path(self.lemons_file) if self.lemons_file else Path(self.dir).parent / \
            "lemons.json"


_POSITIVE = ("busy_timeout_s", "evidence_max_bytes", "retain_days", "lemon_window_days")
_COUNTS = ("lemon_blames", "lemon_deep_failures")


def ledger_config(raw: Any) -> LedgerConfig:
    """The site config's ``ledger`` object, validated (UsageError names the bad key)."""
    if raw is None:
        return LedgerConfig()
    if not isinstance(raw, dict):
        raise UsageError(f"site config ledger={raw!r} must be an object")
    valid = LedgerConfig.__dataclass_fields__
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        listed = ", ".join(f"{k}={getattr(LedgerConfig(), k)!r}" for k in valid)
        raise UsageError(f"site config ledger: unknown key(s) {unknown}; valid keys with "
                         f"defaults: {listed}")
    cfg = LedgerConfig(**raw)
    if not isinstance(cfg.enabled, bool):
        raise UsageError(f"site config ledger.enabled={cfg.enabled!r} must be true or false")
    for key in _POSITIVE:
        v = getattr(cfg, key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise UsageError(f"site config ledger.{key}={v!r} must be a number > 0")
    for key in _COUNTS:
        v = getattr(cfg, key)
        if type(v) is not int or v < 1:
            raise UsageError(f"site config ledger.{key}={v!r} must be an integer >= 1")
    for key in ("dir", "lemons_file"):
        v = getattr(cfg, key)
        if (v is not None or key == "dir") and (not isinstance(v, str)
                                                 or not os.path.isabs(v)):
            raise UsageError(f"site config ledger.{key}={v!r} must be an absolute path")
    return cfg


@dataclass(frozen=True)
class NodeEvent:
    """One row: what happened to ``node`` at ``time``, from which program, for which job."""

    node: str
    kind: EventKind
    source: str
    time: float = 0.0
    job_id: str | None = None
    check: str = ""
    evidence: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"time": self.time, "node": self.node, "kind": self.kind.value,
                "job_id": self.job_id, "source": self.source, "check": self.check,
                "evidence": self.evidence}


def clean_text(text: Any, limit: int = TEXT_LIMIT) -> str:
    """One printable line of at most ``limit`` characters (hostile input made harmless)."""
    s = text if isinstance(text, str) else ("" if text is None else str(text))
    return " ".join("".join(c if c.isprintable() else " " for c in s[:limit * 4]).split())[:limit]


def encode_evidence(evidence: Any, max_bytes: int) -> str:
    """Evidence as JSON text of at most ``max_bytes`` (an excerpt with its size otherwise);
    anything json cannot encode is kept as its text."""
    try:
        text = json.dumps(evidence if evidence is not None else {}, default=str,
                          sort_keys=True, ensure_ascii=True)
    except (ValueError, RecursionError):  # a cycle, or nested past the interpreter's stack
        text = json.dumps({"unencodable": clean_text(repr(type(evidence)))})
    if len(text) <= max_bytes:
        return text
    room = max(max_bytes - 80, 0)
    out = json.dumps({"truncated": True, "bytes": len(text), "excerpt": text[:room]})
    while len(out) > max_bytes and room > 0:  # escaping can grow the excerpt
        room //= 2
        out = json.dumps({"truncated": True, "bytes": len(text), "excerpt": text[:room]})
    return out


def _v1(db: sqlite3.Connection) -> None:
    db.execute("""CREATE TABLE events (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        node TEXT NOT NULL,
        kind TEXT NOT NULL,
        job_id TEXT,
        source TEXT NOT NULL,
        check_name TEXT NOT NULL DEFAULT '',
        evidence TEXT NOT NULL DEFAULT '{}')""")
    db.execute("CREATE INDEX events_node_time ON events (node, time)")
    db.execute("CREATE INDEX events_kind_time ON events (kind, time)")


#: MIGRATIONS[i] takes a database from user_version i to i + 1.
MIGRATIONS: Sequence[Callable[[sqlite3.Connection], None]] = (_v1,)
LEDGER_VERSION = len(MIGRATIONS)


class NodeLedger:
    """The database in ``cfg.dir`` (see the module docstring)."""

    def __init__(self, cfg: LedgerConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.dir)
        self.path = cfg.db_path
        self.clock = clock
        self._shared = False

    # ---------------------------------------------------------------- writing
    def record(self, events: Iterable[NodeEvent]) -> int:
        """Append ``events`` in one transaction (and drop rows past ``retain_days``);
        returns how many were written. Raises LedgerUnavailable, UsageError (a bad node
        name or job id: nothing is written)."""
        now = self.clock()
        rows = [self._row(e, now) for e in events]
        if not rows:
            return 0
        with self._connect(create=True) as db, _write(db):
            db.executemany("INSERT INTO events (time, node, kind, job_id, source, check_name,"
                           " evidence) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            db.execute("DELETE FROM events WHERE time < ? AND kind != ?",
                       (now - self.cfg.retain_days * 86400.0, EventKind.PARDON.value))
        return len(rows)

    def _row(self, e: NodeEvent, now: float) -> tuple[Any, ...]:
        return (e.time or now, check_node_name(e.node), EventKind(e.kind).value,
                None if e.job_id in (None, "") else check_job_id(e.job_id),
                clean_text(e.source, NAME_LIMIT) or "unknown", clean_text(e.check, NAME_LIMIT),
                encode_evidence(e.evidence, self.cfg.evidence_max_bytes))

    # ---------------------------------------------------------------- reading
    def history(self, node: str, limit: int = 200) -> list[NodeEvent]:
        """``node``'s latest ``limit`` events, oldest first."""
        with self._connect(create=False) as db:
            rows = db.execute("SELECT time, node, kind, job_id, source, check_name, evidence "
                              "FROM events WHERE node = ? ORDER BY time DESC, id DESC LIMIT ?",
                              (check_node_name(node), int(limit))).fetchall()
        return [_event(r) for r in reversed(rows)]

    def counts_since(self, since: float) -> dict[str, dict[str, Any]]:
        """Per node, counted from ``since`` or its latest pardon (whichever is later):
        distinct blaming jobs, failed deep checks, and the first and latest event times."""
        sql = """
            WITH p AS (SELECT node, MAX(time) AS t FROM events WHERE kind = :pardon
                       GROUP BY node),
                 e AS (SELECT events.* FROM events LEFT JOIN p ON p.node = events.node
                       WHERE events.time >= MAX(:since, COALESCE(p.t, :since)))
            SELECT node,
                   COUNT(DISTINCT CASE WHEN kind = :blame THEN job_id END),
                   SUM(kind = :deep_failed),
                   (SELECT MIN(time) FROM events AS a WHERE a.node = e.node),
                   MAX(CASE WHEN kind = :returned THEN time END)
            FROM e GROUP BY node"""
        with self._connect(create=False) as db:
            rows = db.execute(sql, {"pardon": EventKind.PARDON.value, "since": since,
                                    "blame": EventKind.BLAME.value,
                                    "deep_failed": EventKind.DEEP_CHECK_FAILED.value,
                                    "returned": EventKind.RETURNED.value}).fetchall()
        return {r[0]: {"blaming_jobs": int(r[1] or 0), "deep_failures": int(r[2] or 0),
                       "first_seen": r[3], "last_returned": r[4]} for r in rows}

    def blaming_jobs(self, node: str, since: float) -> list[str]:
        """The distinct jobs that blamed ``node`` since ``since`` (or its last pardon)."""
        with self._connect(create=False) as db:
            rows = db.execute(
                "SELECT DISTINCT job_id FROM events WHERE node = ? AND kind = ? AND time >= "
                "MAX(?, COALESCE((SELECT MAX(time) FROM events WHERE node = ? AND kind = ?),"
                " ?)) AND job_id IS NOT NULL ORDER BY job_id",
                (node, EventKind.BLAME.value, since, node, EventKind.PARDON.value,
                 since)).fetchall()
        return [r[0] for r in rows]

    def schema_version(self) -> int:
        with self._connect(create=False) as db:
            return int(db.execute("PRAGMA user_version").fetchone()[0])

    # ---------------------------------------------------------------- plumbing
    @contextmanager
    def _connect(self, create: bool) -> Iterator[sqlite3.Connection]:
        if not create and not os.path.lexists(self.path) and self._readable_parent():
            raise LedgerUnavailable(f"no node ledger at {self.path} yet (nothing recorded)")
        self._check_dir(create)
        self._check_file(create)
        try:
            db = sqlite3.connect(self.path, timeout=self.cfg.busy_timeout_s,
                                 isolation_level=None)
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot open {self.path}: {exc}") from exc
        with closing(db):
            try:
                db.execute(f"PRAGMA busy_timeout = {int(self.cfg.busy_timeout_s * 1000)}")
                if db.execute("PRAGMA journal_mode = WAL").fetchone()[0].lower() != "wal":
                    raise LedgerUnavailable(f"{self.path}: WAL mode refused (is the "
                                            "directory on a network filesystem?)")
                db.execute("PRAGMA synchronous = NORMAL")
                migrate(db)
                yield db
            except sqlite3.Error as exc:
                raise LedgerUnavailable(f"node ledger {self.path}: {exc}") from exc

    def _readable_parent(self) -> bool:
        """Whether "not there" is known (a missing or listable directory), rather than
        hidden from a user who may not enter it (then _check_dir says whose it is)."""
        return not self.dir.exists() or os.access(self.dir, os.R_OK | os.X_OK)

    def _check_dir(self, create: bool) -> None:
        """Root's (or the writer's) directory that no other user can enter: mode 0700, or
        2770 where it is shared with SlurmUser's group (made inside a setgid directory such
        as the reserve's log directory, root:SlurmUser 2775), so that EpilogSlurmctld,
        which runs as SlurmUser, and root's programs write the same database."""
        if create and not os.path.lexists(self.dir):
            try:
                self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                if os.stat(self.dir.parent).st_mode & stat.S_ISGID:
                    os.chmod(self.dir, 0o2770)  # the group (SlurmUser's) came from the parent
            except OSError as exc:
                raise LedgerUnavailable(f"cannot create {self.dir}: {exc}") from exc
        try:
            st = os.lstat(self.dir)
        except OSError as exc:
            raise LedgerUnavailable(f"{self.dir}: {exc.strerror}") from exc
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), 0) \
                or st.st_mode & 0o007:
            raise LedgerUnavailable(
                f"{self.dir} must be a directory owned by uid {os.geteuid()} or root that "
                f"others cannot enter (mode 0700, or 2770 for SlurmUser's group; found uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): anyone else who can "
                "write there could forge or lock the node ledger")
        self._shared = bool(st.st_mode & 0o070)

    def _check_file(self, create: bool) -> None:
        """A regular file, never a link (sqlite would follow it), no access for others.
        Only root and the directory's group can create files in the directory, so who of
        them created it does not matter; in a shared directory it is made group-writable."""
        if create:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                try:
                    if self._shared and os.fstat(fd).st_mode & 0o777 != 0o660:
                        os.fchmod(fd, 0o660)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise LedgerUnavailable(f"cannot create {self.path}: {exc}") from exc
        try:
            st = os.lstat(self.path)
        except OSError as exc:
            raise LedgerUnavailable(f"{self.path}: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_mode & 0o007:
            raise LedgerUnavailable(f"{self.path} must be a regular file with one link and "
                                    "no access for others")


@contextmanager
def _write(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction holding the write lock from its start (one writer at a time)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def migrate(db: sqlite3.Connection) -> int:
    """Bring ``db`` to LEDGER_VERSION (a no-op when it is there); returns the version it
    had. Each step runs in its own write transaction with the version bump, so a crash
    leaves a database at some whole version."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version > LEDGER_VERSION:
        raise LedgerUnavailable(f"the node ledger has schema version {version}, newer than "
                                f"this slurm_robust's {LEDGER_VERSION}: upgrade slurm_robust")
    start = version
    while version < LEDGER_VERSION:
        with _write(db):
            # Re-read under the lock: another process may have migrated meanwhile.
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version >= LEDGER_VERSION:
                break
            MIGRATIONS[version](db)
            version += 1
            db.execute(f"PRAGMA user_version = {int(version)}")
    return start


def _event(row: tuple[Any, ...]) -> NodeEvent:
    t, node, kind, job_id, source, check, evidence = row
    try:
        ev = json.loads(evidence)
    except ValueError:
        ev = {"unparsed": evidence[:200]}
    try:
        k = EventKind(kind)
    except ValueError:  # a kind from a newer writer (a downgraded reader shows it raw)
        k = EventKind.CHECK_FAILED
        ev = {"kind": kind, "evidence": ev}
    return NodeEvent(node, k, source, t, job_id, check, ev)
