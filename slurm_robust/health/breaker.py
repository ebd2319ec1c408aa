"""The drain circuit breaker: a cap on how many nodes the automatic drain paths may take
out of service in a sliding window, cluster-wide.

An automated drainer is also the largest single risk to a fleet: one buggy check, a
driver update that rewords a message, or a shared filesystem hiccup seen by every node at
once would drain them all within minutes. So every automatic drain asks the breaker
first (:meth:`DrainBreaker.claim`): up to ``max_drains`` distinct nodes per ``window_s``
are granted; past that the breaker is *tripped*, and further drains are recorded as
"would drain" with their reason and source while the nodes keep running, until the
window slides past the old drains or an admin runs ``slurm-robust breaker reset``.
A node already granted in the window is granted again (a refreshed reason is not a new
drain).

The state is two JSON-lines files and a lock file in ``breaker.dir``, which must be on a
filesystem every node shares (the prologs of many nodes ask at once; the claim is one
critical section under an exclusive ``flock``) and owned by root, mode 0700: no user can
read, hold the lock, or plant a file there. The lock is waited for at most LOCK_WAIT_S.

Site config (``"breaker"``, all optional)::

    {"max_drains": 4, "window_s": 3600, "dir": "/shared/slurm_robust/breaker"}

``max_drains`` null (the default) turns the breaker off: every drain goes ahead as
before. A breaker that is on but cannot be asked (its directory unsafe or missing on this
node, the lock not had in time) lets the drain go ahead too and says why: a node that
failed a check is not kept in service by a broken breaker.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.records import (
    append_records,
    encode_record,
    make_record,
    read_records,
    write_bytes_atomic,
)

BREAKER_SCHEMA = "slurm_robust.breaker"
BREAKER_VERSION = 1
LOCK_WAIT_S = 10.0
#: "Would drain" records kept when the file is trimmed, and the size that trims it.
WOULD_DRAIN_KEEP = 10_000
WOULD_DRAIN_TRIM_BYTES = 16 << 20
CLAIMS_FILE = "claims.jsonl"
WOULD_DRAIN_FILE = "would_drain.jsonl"
LOCK_FILE = "lock"


class BreakerUnavailable(Exception):
    """The breaker is on but cannot be asked here (the reason says why)."""


@dataclass(frozen=True)
class BreakerConfig:
    max_drains: int | None = None
    window_s: float = 3600.0
    dir: str = "/var/lib/slurm_robust/breaker"

    @property
    def enabled(self) -> bool:
        return self.max_drains is not None


def breaker_config(raw: Any) -> BreakerConfig:
    """The site config's ``breaker`` object, validated (UsageError names the bad key)."""
    if raw is None:
        return BreakerConfig()
    if not isinstance(raw, dict):
        raise UsageError(f"site config breaker={raw!r} must be an object")
    unknown = sorted(set(raw) - {"max_drains", "window_s", "dir"})
    if unknown:
        raise UsageError(f"site config breaker: unknown key(s) {unknown}; valid: "
                         "max_drains (int >= 1 or null), window_s (seconds > 0), dir (path)")
    cfg = BreakerConfig(**raw)
    if cfg.max_drains is not None and (type(cfg.max_drains) is not int or cfg.max_drains < 1):
        raise UsageError(f"site config breaker.max_drains={cfg.max_drains!r} must be an "
                         "integer >= 1, or null for no breaker")
    if isinstance(cfg.window_s, bool) or not isinstance(cfg.window_s, int | float) \
            or not cfg.window_s > 0:
        raise UsageError(f"site config breaker.window_s={cfg.window_s!r} must be seconds > 0")
    if not isinstance(cfg.dir, str) or not os.path.isabs(cfg.dir):
        raise UsageError(f"site config breaker.dir={cfg.dir!r} must be an absolute path")
    return cfg


@dataclass(frozen=True)
class Claim:
    """The breaker's answer to one drain: ``granted``, and the count it was decided on."""

    granted: bool
    node: str
    in_window: int
    max_drains: int | None
    why: str


class DrainBreaker:
    """See the module docstring."""

    def __init__(self, cfg: BreakerConfig) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.dir)

    def claim(self, node: str, reason: str, source: str, now: float | None = None) -> Claim:
        """Ask to drain ``node`` (``source``: prolog, epilog, reserve...). Off: granted.
        Raises BreakerUnavailable when the breaker is on but cannot be asked."""
        cfg = self.cfg
        if cfg.max_drains is None:
            return Claim(True, node, 0, None, "breaker off")
        now = time.time() if now is None else now
        with self._locked(create=True):
            claims = self._claims(now)
            nodes = {c["node"] for c in claims}
            record = make_record(BREAKER_SCHEMA, BREAKER_VERSION,
                                 {"node": node, "reason": reason[:300], "source": source}, now)
            if node in nodes:
                return Claim(True, node, len(nodes), cfg.max_drains,
                             f"{node} already drained in this window")
            if len(nodes) >= cfg.max_drains:
                self._append_would_drain({**record, "in_window": len(nodes)})
                return Claim(False, node, len(nodes), cfg.max_drains,
                             f"breaker tripped: {len(nodes)} node(s) drained in the last "
                             f"{cfg.window_s:g} s (limit {cfg.max_drains}); recorded as "
                             "would drain, the node stays in service")
            self._rewrite(CLAIMS_FILE, [*claims, record])
            return Claim(True, node, len(nodes) + 1, cfg.max_drains, "granted")

    def status(self, now: float | None = None, last: int = 20) -> dict[str, Any]:
        """What ``breaker status`` prints: the drains in the window, tripped or not, and
        the latest "would drain" records."""
        cfg = self.cfg
        out: dict[str, Any] = {"schema": BREAKER_SCHEMA, "v": BREAKER_VERSION,
                               "enabled": cfg.enabled, "max_drains": cfg.max_drains,
                               "window_s": cfg.window_s, "dir": str(self.dir)}
        if not cfg.enabled:
            return {**out, "in_window": 0, "tripped": False, "drains": [], "would_drain": [],
                    "would_drain_total": 0}
        now = time.time() if now is None else now
        with self._locked(create=False):
            claims = self._claims(now)
            would = self._read(WOULD_DRAIN_FILE)
        nodes = sorted({c["node"] for c in claims})
        return {**out, "in_window": len(nodes),
                "tripped": cfg.max_drains is not None and len(nodes) >= cfg.max_drains,
                "drains": claims, "would_drain": would[-last:],
                "would_drain_total": sum(1 for w in would if "node" in w)}

    def reset(self, who: str, now: float | None = None) -> int:
        """Forget the drains in the window (an admin looked at them); returns how many.
        The reset itself is recorded among the "would drain" lines."""
        now = time.time() if now is None else now
        with self._locked(create=False):
            claims = self._claims(now)
            self._rewrite(CLAIMS_FILE, [])
            self._append_would_drain(make_record(
                BREAKER_SCHEMA, BREAKER_VERSION,
                {"reset_by": who, "forgotten": sorted({c["node"] for c in claims})}, now))
        return len(claims)

    # ------------------------------------------------------------------ files
    def _claims(self, now: float) -> list[dict[str, Any]]:
        return [c for c in self._read(CLAIMS_FILE)
                if isinstance(c.get("time"), int | float) and isinstance(c.get("node"), str)
                and now - c["time"] < self.cfg.window_s]

    def _read(self, name: str) -> list[dict[str, Any]]:
        # A torn line (a node lost mid-write) is skipped: read_records counts it malformed.
        return read_records(self.dir / name, BREAKER_SCHEMA).records

    def _rewrite(self, name: str, records: list[dict[str, Any]]) -> None:
        write_bytes_atomic(self.dir / name, [encode_record(r) for r in records], mode=0o600)

    def _append_would_drain(self, record: dict[str, Any]) -> None:
        """One appended line: the held-back drains of a mass failure come thousands at
        once under the lock, and rewriting the file for each (measured: 4,096 claims took
        149 s) would make the later prologs miss the lock and drain anyway. Trimmed to the
        last WOULD_DRAIN_KEEP lines only once it passes WOULD_DRAIN_TRIM_BYTES."""
        path = self.dir / WOULD_DRAIN_FILE
        append_records(path, [record], mode=0o600)
        if path.stat().st_size > WOULD_DRAIN_TRIM_BYTES:
            self._rewrite(WOULD_DRAIN_FILE, self._read(WOULD_DRAIN_FILE)[-WOULD_DRAIN_KEEP:])

    @contextmanager
    def _locked(self, create: bool) -> Iterator[None]:
        self._check_dir(create)
        try:
            fd = os.open(self.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise BreakerUnavailable(f"cannot open {self.dir / LOCK_FILE}: {exc}") from exc
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES) \
                            or time.monotonic() > deadline:
                        raise BreakerUnavailable(f"the breaker's lock {self.dir / LOCK_FILE} "
                                                 f"was not had in {LOCK_WAIT_S:g} s") from exc
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def _check_dir(self, create: bool) -> None:
        """Root's (or this process owner's) private directory, never another user's."""
        if create:
            try:
                self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise BreakerUnavailable(f"cannot create {self.dir}: {exc}") from exc
        try:
            st = os.lstat(self.dir)
        except OSError as exc:
            raise BreakerUnavailable(f"{self.dir}: {exc.strerror}") from exc
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise BreakerUnavailable(
                f"{self.dir} must be a directory owned by uid {os.geteuid()} with mode "
                f"0700 (found uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): anyone "
                "else who can write there could hold or forge the breaker")


def site_breaker(raw: Any) -> DrainBreaker | None:
    """The breaker of a site config's ``breaker`` section, or None when it is off.
    Raises UsageError for a section that does not fit (``check`` reports it first)."""
    cfg = breaker_config(raw)
    return DrainBreaker(cfg) if cfg.enabled else None
