"""Lemons: nodes that keep failing jobs without ever failing a check for long enough to
stay drained. Scored from the node ledger (health/node_ledger.py).

The rule (site config ``ledger``; defaults in docs/ADMIN_GUIDE.md, "Node ledger and
lemons"): a node is a lemon when, within the last ``lemon_window_days`` (and since its
latest admin pardon),

- ``lemon_blames`` or more DISTINCT jobs blamed it (one job blaming it over and over is
  one suspicion, and a hostile job cannot make a lemon alone), or
- ``lemon_deep_failures`` or more of its deep checks failed.

Time in service (from its first ledger row, or the window's start if later, to now) is
reported with each score as a rate, blames per 30 days of service, so an admin can tell a
node blamed three times in a week from one blamed three times in a month; the threshold
itself is on counts, which an admin can check by hand in ``node history``.

Consumers: the reserve never admits a lemon (reserve/plan.py), and ``slurm-robust
submit`` excludes lemons (``--allow-lemons`` to override). Users cannot read the ledger,
so the writers publish the lemons' names (nothing else) to ``ledger.lemons_file``,
mode 0644, rewritten atomically when the set changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.node_ledger import LedgerConfig, NodeLedger
from slurm_robust.records import read_json_bounded, write_json_atomic
from slurm_robust.slurm import check_node_name

LEMONS_SCHEMA = "slurm_robust.lemons"
LEMONS_VERSION = 1
DAY_S = 86400.0
#: A published list is read by every submission: bound what a reader accepts.
LEMONS_FILE_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class LemonScore:
    """One node's counts in the window, and whether they make it a lemon (``why``)."""

    node: str
    blaming_jobs: int
    deep_failures: int
    service_days: float
    blames_per_30d: float
    lemon: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "blaming_jobs": self.blaming_jobs,
                "deep_failures": self.deep_failures, "service_days": self.service_days,
                "blames_per_30d": self.blames_per_30d, "lemon": self.lemon, "why": self.why}


def score(node: str, counts: dict[str, Any], cfg: LedgerConfig, now: float) -> LemonScore:
    """Pure: ``counts`` is one node's entry of :meth:`NodeLedger.counts_since`."""
    window_s = cfg.lemon_window_days * DAY_S
    first = counts.get("first_seen") or now
    service_s = max(now - max(first, now - window_s), 0.0)
    days = service_s / DAY_S
    jobs, deep = int(counts.get("blaming_jobs", 0)), int(counts.get("deep_failures", 0))
    reasons = []
    if jobs >= cfg.lemon_blames:
        reasons.append(f"blamed by {jobs} distinct jobs in {cfg.lemon_window_days:g} days "
                       f"(threshold {cfg.lemon_blames})")
    if deep >= cfg.lemon_deep_failures:
        reasons.append(f"{deep} failed deep checks in {cfg.lemon_window_days:g} days "
                       f"(threshold {cfg.lemon_deep_failures})")
    rate = jobs / max(days, 1.0) * 30.0
    return LemonScore(node, jobs, deep, round(days, 2), round(rate, 2), bool(reasons),
                      "; ".join(reasons))


def scores(ledger: NodeLedger, now: float | None = None) -> list[LemonScore]:
    """Every node with an event in the window, lemons first, then by blaming jobs.
    Raises LedgerUnavailable."""
    now = time.time() if now is None else now
    since = now - ledger.cfg.lemon_window_days * DAY_S
    out = [score(n, c, ledger.cfg, now) for n, c in ledger.counts_since(since).items()]
    return sorted(out, key=lambda s: (not s.lemon, -s.blaming_jobs, -s.deep_failures, s.node))


def lemons(ledger: NodeLedger, now: float | None = None) -> list[str]:
    return sorted(s.node for s in scores(ledger, now) if s.lemon)


def publish(path: Path, names: list[str], now: float | None = None) -> bool:
    """Write the lemons' names to ``path`` (0644) when they differ from what is there;
    returns whether it wrote."""
    names = sorted(set(names))
    try:
        if read_published(path) == names:
            return False
    except (OSError, ValueError):
        pass  # missing or unreadable: write it
    write_json_atomic(path, {"schema": LEMONS_SCHEMA, "v": LEMONS_VERSION,
                             "time": time.time() if now is None else now, "lemons": names},
                      mode=0o644)
    return True


def read_published(path: Path) -> list[str]:
    """The published lemons (what ``submit`` excludes). Raises OSError (missing,
    unreadable) or ValueError (not a lemons file, or a name that is not a node name:
    a planted file must not smuggle options into sbatch)."""
    obj = read_json_bounded(path, LEMONS_FILE_MAX_BYTES)
    if not isinstance(obj, dict) or obj.get("schema") != LEMONS_SCHEMA \
            or not isinstance(obj.get("lemons"), list):
        raise ValueError(f"{path} is not a {LEMONS_SCHEMA} file")
    out = []
    for name in obj["lemons"]:
        try:
            out.append(check_node_name(name if isinstance(name, str) else ""))
        except UsageError as exc:
            raise ValueError(f"{path}: {exc}") from exc
    return sorted(set(out))
