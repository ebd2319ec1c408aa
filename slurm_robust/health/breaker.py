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

    {"max_drains": 8, "max_share": 0.02, "window_s": 3600,
     "dir": "/shared/slurm_robust/breaker",
     "partitions": {"gpu-h100": {"max_drains": 4, "max_share": 0.05}},
     "webhook": "https://alerts.example.org/hooks/slurm"}

Limits, each on the distinct nodes drained in the window: cluster-wide ``max_drains``
(absolute) and ``max_share`` (a share of all nodes), and per partition the same two keys
for the drains of that partition's nodes (a node in two partitions counts in both). With
both an absolute and a share, the smaller applies; a share never allows less than one
node. The first limit reached trips the breaker for the drains it covers: a GPU partition
at its limit holds its own nodes back while the CPU nodes still drain. Share and
partition limits need the partitions' nodes: one ``scontrol show partition`` call per
claim, only when such a limit is set (claims happen on the failure path only); a call
that fails leaves those limits out for that claim and says so, the absolute cluster-wide
limit still holds.

``webhook`` (an http(s) URL) is POSTed one JSON object when the breaker trips (the first
held-back drain after a granted one or a reset): the node, reason, source and the limit
reached, with a 3 s timeout; a hook that fails is logged, never retried, never blocks a
drain decision. The exporter's ``slurm_robust_drain_breaker_tripped`` is the alert that
does not depend on it.

No limit set (the default) turns the breaker off: every drain goes ahead as before. A
breaker that is on but cannot be asked (its directory unsafe or missing on this node, the
lock not had in time) lets the drain go ahead too and says why: a node that failed a
check is not kept in service by a broken breaker.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import math
import os
import stat
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
#: Present while the breaker holds drains back: the first held drain of a trip sends the
#: webhook, the next grant or a reset removes it.
HELD_FILE = "held"
CLUSTER = "the cluster"
WEBHOOK_TIMEOUT_S = 3.0
TOPOLOGY_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


class BreakerUnavailable(Exception):
    """The breaker is on but cannot be asked here (the reason says why)."""


@dataclass(frozen=True)
class Limit:
    """An absolute and a share limit on distinct nodes drained in the window (None: not
    set). ``for_size`` is the one that applies to ``nodes`` nodes."""

    max_drains: int | None = None
    max_share: float | None = None

    @property
    def set(self) -> bool:
        return self.max_drains is not None or self.max_share is not None

    def for_size(self, nodes: int | None) -> int | None:
        limits = [] if self.max_drains is None else [self.max_drains]
        if self.max_share is not None and nodes is not None:
            limits.append(max(1, math.floor(self.max_share * nodes)))
        return min(limits) if limits else None


@dataclass(frozen=True)
class BreakerConfig:
    max_drains: int | None = None
    window_s: float = 3600.0
    dir: str = "/var/lib/slurm_robust/breaker"
    max_share: float | None = None
    partitions: dict[str, Limit] = field(default_factory=dict)
    webhook: str | None = None

    @property
    def cluster(self) -> Limit:
        return Limit(self.max_drains, self.max_share)

    @property
    def enabled(self) -> bool:
        return self.cluster.set or any(lim.set for lim in self.partitions.values())

    @property
    def needs_topology(self) -> bool:
        """Share or partition limits: the partitions' nodes must be known."""
        return self.max_share is not None or any(lim.set for lim in self.partitions.values())


VALID = ("max_drains (int >= 1 or null), max_share (0 < share <= 1 or null), window_s "
         "(seconds > 0), dir (absolute path), partitions ({name: {max_drains, max_share}}), "
         "webhook (http(s) URL or null)")


def _limit(raw: dict[str, Any], where: str) -> Limit:
    n, share = raw.get("max_drains"), raw.get("max_share")
    if n is not None and (type(n) is not int or n < 1):
        raise UsageError(f"site config {where}.max_drains={n!r} must be an integer >= 1, "
                         "or null")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int | float)
                              or not 0 < share <= 1):
        raise UsageError(f"site config {where}.max_share={share!r} must be a share of the "
                         "nodes in (0, 1], or null")
    return Limit(n, None if share is None else float(share))


def breaker_config(raw: Any) -> BreakerConfig:
    """The site config's ``breaker`` object, validated (UsageError names the bad key)."""
    if raw is None:
        return BreakerConfig()
    if not isinstance(raw, dict):
        raise UsageError(f"site config breaker={raw!r} must be an object")
    unknown = sorted(set(raw) - {"max_drains", "window_s", "dir", "max_share", "partitions",
                                 "webhook"})
    if unknown:
        raise UsageError(f"site config breaker: unknown key(s) {unknown}; valid: {VALID}")
    cluster = _limit(raw, "breaker")
    window_s = raw.get("window_s", 3600.0)
    if isinstance(window_s, bool) or not isinstance(window_s, int | float) or not window_s > 0:
        raise UsageError(f"site config breaker.window_s={window_s!r} must be seconds > 0")
    where = raw.get("dir", BreakerConfig.dir)
    if not isinstance(where, str) or not os.path.isabs(where):
        raise UsageError(f"site config breaker.dir={where!r} must be an absolute path")
    parts_raw = raw.get("partitions", {})
    if not isinstance(parts_raw, dict):
        raise UsageError(f"site config breaker.partitions={parts_raw!r} must be an object "
                         "{partition: {max_drains, max_share}}")
    parts: dict[str, Limit] = {}
    for name, lim in parts_raw.items():
        key = f"breaker.partitions.{name}"
        if not isinstance(lim, dict) or set(lim) - {"max_drains", "max_share"} or not lim:
            raise UsageError(f"site config {key}={lim!r} must be an object with max_drains "
                             "and/or max_share")
        parts[name] = _limit(lim, key)
    hook = raw.get("webhook")
    if hook is not None and (not isinstance(hook, str)
                             or urlsplit(hook).scheme not in ("http", "https")
                             or not urlsplit(hook).netloc):
        raise UsageError(f"site config breaker.webhook={hook!r} must be an http(s) URL, "
                         "or null")
    return BreakerConfig(cluster.max_drains, float(window_s), where, cluster.max_share,
                         parts, hook)


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

    def __init__(self, cfg: BreakerConfig,
                 topology: Callable[[], dict[str, set[str]]] | None = None) -> None:
        self.cfg = cfg
        self.dir = Path(cfg.dir)
        #: partition -> its nodes; read only for share and partition limits.
        self.topology = topology or slurm_topology

    def claim(self, node: str, reason: str, source: str, now: float | None = None) -> Claim:
        """Ask to drain ``node`` (``source``: prolog, epilog, reserve...). Off: granted.
        Raises BreakerUnavailable when the breaker is on but cannot be asked."""
        cfg = self.cfg
        if not cfg.enabled:
            return Claim(True, node, 0, None, "breaker off")
        now = time.time() if now is None else now
        members, note = self._topology_or_none() if cfg.needs_topology else (None, "")
        mine = sorted(p for p, nodes in (members or {}).items() if node in nodes)
        notify: dict[str, Any] | None = None
        with self._locked(create=True):
            claims = self._claims(now)
            nodes = {c["node"] for c in claims}
            record = make_record(BREAKER_SCHEMA, BREAKER_VERSION,
                                 {"node": node, "reason": reason[:300], "source": source,
                                  "partitions": mine}, now)
            if node in nodes:
                return Claim(True, node, len(nodes), cfg.max_drains,
                             f"{node} already drained in this window")
            reached = self._reached(node, mine, claims, members)
            if reached is not None:
                what, count, limit = reached
                self._append_would_drain({**record, "in_window": count, "limit": what})
                held = self._held()
                if what not in held:  # this limit just tripped
                    self._set_held(held | {what})
                    notify = {**record, "in_window": count, "limit": what, "max": limit}
                claim = Claim(False, node, count, limit,
                              f"breaker tripped: {count} node(s) of {what} drained in the "
                              f"last {cfg.window_s:g} s (limit {limit}); recorded as would "
                              "drain, the node stays in service" + note)
            else:
                self._rewrite(CLAIMS_FILE, [*claims, record])
                held = self._held()
                if held:  # the limits this node counts under are below their limit again
                    self._set_held(held - {CLUSTER, *(f"partition {p}" for p in mine)})
                claim = Claim(True, node, len(nodes) + 1, cfg.max_drains, "granted" + note)
        if notify is not None:
            self._post(notify)
        return claim

    def _reached(self, node: str, mine: list[str], claims: list[dict[str, Any]],
                 members: dict[str, set[str]] | None) -> tuple[str, int, int] | None:
        """The first limit over ``node`` that one more drain would pass: (what, count,
        limit)."""
        return next(((what, n, lim) for what, n, lim in self._scopes(claims, members, mine)
                     if n >= lim), None)

    def _scopes(self, claims: list[dict[str, Any]], members: dict[str, set[str]] | None,
                partitions: list[str]) -> Iterator[tuple[str, int, int]]:
        """(what, distinct nodes drained in the window, limit) for the cluster and each of
        ``partitions`` that has a limit (shares need ``members``)."""
        cfg = self.cfg
        total = len(set().union(*members.values())) if members else None
        limit = cfg.cluster.for_size(total)
        if limit is not None:
            yield CLUSTER, len({c["node"] for c in claims}), limit
        for part in partitions:
            lim = cfg.partitions.get(part)
            if lim is None or members is None or part not in members:
                continue
            limit = lim.for_size(len(members[part]))
            if limit is not None:
                yield (f"partition {part}",
                       len({c["node"] for c in claims if part in c.get("partitions", ())
                            or c["node"] in members[part]}), limit)

    def _topology_or_none(self) -> tuple[dict[str, set[str]] | None, str]:
        try:
            return self.topology(), ""
        except Exception as exc:  # noqa: BLE001 - a failed read drops these limits only
            return None, (f" (share and partition limits not applied: partitions not read: "
                          f"{str(exc)[:120]})")

    def _held(self) -> set[str]:
        """The limits holding drains back since their trip (their webhook was sent)."""
        try:
            raw = json.loads((self.dir / HELD_FILE).read_text())
        except (OSError, ValueError):
            return set()
        return {x for x in raw if isinstance(x, str)} if isinstance(raw, list) else set()

    def _set_held(self, held: set[str]) -> None:
        if held:
            write_bytes_atomic(self.dir / HELD_FILE, [json.dumps(sorted(held)).encode()],
                               mode=0o600)
        else:
            (self.dir / HELD_FILE).unlink(missing_ok=True)

    def _post(self, payload: dict[str, Any]) -> None:
        if not self.cfg.webhook:
            return
        body = json.dumps({"event": "drain_breaker_tripped", **payload}).encode()
        req = urllib.request.Request(self.cfg.webhook, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT_S) as resp:
                resp.read(1024)
        except (OSError, ValueError) as exc:
            log.warning("drain breaker webhook %s failed: %s", self.cfg.webhook, exc)

    def status(self, now: float | None = None, last: int = 20) -> dict[str, Any]:
        """What ``breaker status`` prints: the drains in the window, the limits reached
        (``tripped``: any), and the latest "would drain" records."""
        cfg = self.cfg
        out: dict[str, Any] = {"schema": BREAKER_SCHEMA, "v": BREAKER_VERSION,
                               "enabled": cfg.enabled, "max_drains": cfg.max_drains,
                               "max_share": cfg.max_share,
                               "partitions": {k: {"max_drains": v.max_drains,
                                                  "max_share": v.max_share}
                                              for k, v in cfg.partitions.items()},
                               "window_s": cfg.window_s, "dir": str(self.dir)}
        if not cfg.enabled:
            return {**out, "in_window": 0, "tripped": False, "limits_reached": [],
                    "drains": [], "would_drain": [], "would_drain_total": 0}
        now = time.time() if now is None else now
        members, note = self._topology_or_none() if cfg.needs_topology else (None, "")
        with self._locked(create=False):
            claims = self._claims(now)
            would = self._read(WOULD_DRAIN_FILE)
        reached = self.limits_reached(claims, members)
        return {**out, "in_window": len({c["node"] for c in claims}),
                "tripped": bool(reached), "limits_reached": reached,
                **({"note": note.strip(" ()")} if note else {}),
                "drains": claims, "would_drain": would[-last:],
                "would_drain_total": sum(1 for w in would if "node" in w)}

    def limits_reached(self, claims: list[dict[str, Any]],
                       members: dict[str, set[str]] | None) -> list[str]:
        """The limits at which a further drain under them would be held back."""
        return [what for what, n, lim in self._scopes(claims, members,
                                                      sorted(self.cfg.partitions))
                if n >= lim]

    def reset(self, who: str, now: float | None = None) -> int:
        """Forget the drains in the window (an admin looked at them); returns how many.
        The reset itself is recorded among the "would drain" lines."""
        now = time.time() if now is None else now
        with self._locked(create=False):
            claims = self._claims(now)
            self._rewrite(CLAIMS_FILE, [])
            self._set_held(set())
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


def slurm_topology() -> dict[str, set[str]]:
    """Every partition's nodes (Slurm.partition_members), with one attempt and a bound."""
    from slurm_robust.slurm import Slurm
    from slurm_robust.slurm.runner import RetryPolicy

    return Slurm(policy=RetryPolicy(attempts=1, timeout_s=TOPOLOGY_TIMEOUT_S)
                 ).partition_members()


def site_breaker(raw: Any) -> DrainBreaker | None:
    """The breaker of a site config's ``breaker`` section, or None when it is off.
    Raises UsageError for a section that does not fit (``check`` reports it first)."""
    cfg = breaker_config(raw)
    return DrainBreaker(cfg) if cfg.enabled else None
