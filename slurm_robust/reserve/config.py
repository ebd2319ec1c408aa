"""The ``reserve`` section of the site config, as one typed, validated object.

Unknown keys are refused with the valid keys and their defaults (a misspelt key must not be
ignored silently); relationships between values are checked at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.site_config import SiteConfig

HOUR_S = 3600.0
# The reserve's log files and lock are written by root (reconcile, node programs) and by
# SlurmUser (EpilogSlurmctld), which is not root on real sites: group-writable, the group
# being SlurmUser's (the log directory is setgid to it).
SHARED_FILE_MODE = 0o664


@dataclass(frozen=True)
class ReserveConfig:
    """Warm-reserve settings (site config section ``reserve``).

    Attributes:
        partition: the reserve partition (its members are the warm spares).
        train_partitions: partitions robust jobs run in; the reserve is filled from their
            idle nodes and hands spares back to them. The first is the home partition that
            surplus spares return to.
        target: fixed reserve size; null means computed (binomial quantile, see sizing).
        min_target: lower bound of the computed target (a reserve of 0 can hand nothing over).
        quantile: the quantile of simultaneous failures the reserve covers (0.99 = P99).
        robust_nodes: nodes robust jobs use, for sizing; null means all nodes of
            ``train_partitions``.
        failure_prob_prior: per-node failure probability per replacement window, used when
            there is no history (ByteRobust's table is reproduced by 0.0012).
        prior_weight: how many node-windows of evidence the prior is worth when it is blended
            with the failures counted in the journals (pseudo-count).
        replacement_window_h: how long a failed node is out before it is replaced/returned.
        history_h: how far back failures are counted to estimate the failure probability.
        freshness_h: a spare must have passed the deep suite within this many hours.
        repeat_window_h: a node that fails again within this many hours of being returned to
            service is a repeat offender and stays drained for an admin.
        lock_path: exclusive lock for reserve state changes; null means
            ``<dir of verdict_log>/reserve.lock``.
        log_path: JSON-lines log of every reserve action; null means
            ``<dir of verdict_log>/reserve.jsonl``.
        verdict_dir: spool directory where jobs leave verdicts for EpilogSlurmctld, on a
            filesystem both the compute nodes and the controller see; null means
            ``<dir of verdict_log>/verdicts``. See docs/SCHEMAS.md (verdicts).
        verdict_max_bytes: larger verdict files are refused unread.
        verdict_max_records: at most this many verdicts are applied per job end.
        job_blame_cap: the most nodes one job may get drained by its verdicts, and the most
            spares it may be handed, over its whole life (all restarts); null means the
            job's node count (a job never drains more nodes than it holds); verdicts over the
            cap are refused and logged (a runaway or hostile job must not drain the
            cluster). Counted in a root-owned ledger (``<dir of verdict_log>/jobs``).
        spare_retries: how many times a job's handed-over spares that fail a check (their
            prolog) are replaced from the reserve before the job runs on what is left,
            or is stopped with a verdict when that is too little.
        lock_timeout_s: how long to wait for the lock before giving up.
        call_timeout_s: timeout of each Slurm call made by the reserve.
    """

    partition: str = "standby"
    train_partitions: tuple[str, ...] = ("train",)
    target: int | None = None
    min_target: int = 1
    quantile: float = 0.99
    robust_nodes: int | None = None
    failure_prob_prior: float = 0.0012
    prior_weight: float = 1000.0
    replacement_window_h: float = 24.0
    history_h: float = 30 * 24.0
    freshness_h: float = 24.0
    repeat_window_h: float = 72.0
    lock_path: str | None = None
    log_path: str | None = None
    verdict_dir: str | None = None
    verdict_max_bytes: int = 256 * 1024
    verdict_max_records: int = 64
    job_blame_cap: int | None = None
    spare_retries: int = 2
    lock_timeout_s: float = 60.0
    call_timeout_s: float = 20.0
    # The site's verdict_log directory, used for the derived paths; not a config key.
    base_dir: str = field(default="/var/log/slurm_robust", repr=False)

    def __post_init__(self) -> None:
        _check(bool(self.partition), "partition must be a non-empty partition name")
        _check(bool(self.train_partitions), "train_partitions must name at least one partition")
        _check(self.partition not in self.train_partitions,
               f"partition {self.partition!r} must not also be a train partition")
        _check(self.target is None or self.target >= 0, "target must be null or >= 0")
        _check(self.min_target >= 0, "min_target must be >= 0")
        _check(0.0 < self.quantile < 1.0, "quantile must be in (0, 1)")
        _check(self.robust_nodes is None or self.robust_nodes >= 0,
               "robust_nodes must be null or >= 0")
        _check(0.0 <= self.failure_prob_prior <= 1.0, "failure_prob_prior must be in [0, 1]")
        _check(self.prior_weight > 0, "prior_weight must be > 0")
        for name in ("replacement_window_h", "history_h", "freshness_h", "repeat_window_h",
                     "lock_timeout_s", "call_timeout_s"):
            _check(getattr(self, name) > 0, f"{name} must be > 0")
        _check(self.history_h >= self.replacement_window_h,
               "history_h must be >= replacement_window_h")
        _check(self.verdict_max_bytes > 0 and self.verdict_max_records > 0,
               "verdict_max_bytes and verdict_max_records must be > 0")
        _check(self.job_blame_cap is None or self.job_blame_cap >= 1,
               "job_blame_cap must be null or >= 1")
        _check(self.spare_retries >= 0, "spare_retries must be >= 0")

    @property
    def lock_file(self) -> Path:
        return Path(self.lock_path or Path(self.base_dir) / "reserve.lock")

    @property
    def log_file(self) -> Path:
        return Path(self.log_path or Path(self.base_dir) / "reserve.jsonl")

    @property
    def verdict_root(self) -> Path:
        return Path(self.verdict_dir or Path(self.base_dir) / "verdicts")

    @property
    def ledger_dir(self) -> Path:
        """Root-owned per-job ledgers of drains and handoffs (the blame cap)."""
        return Path(self.base_dir) / "jobs"

    @property
    def home_partition(self) -> str:
        return self.train_partitions[0]


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise UsageError(f"site config reserve: {message}")


_TYPES: dict[str, tuple[type, ...]] = {
    "partition": (str,), "train_partitions": (list, tuple), "target": (int, type(None)),
    "min_target": (int,), "quantile": (float, int), "robust_nodes": (int, type(None)),
    "failure_prob_prior": (float, int), "prior_weight": (float, int),
    "replacement_window_h": (float, int), "history_h": (float, int),
    "freshness_h": (float, int), "repeat_window_h": (float, int),
    "lock_path": (str, type(None)), "log_path": (str, type(None)),
    "verdict_dir": (str, type(None)), "verdict_max_bytes": (int,),
    "verdict_max_records": (int,), "job_blame_cap": (int, type(None)),
    "spare_retries": (int,), "lock_timeout_s": (float, int),
    "call_timeout_s": (float, int),
}


def reserve_config(site: SiteConfig, **overrides: Any) -> ReserveConfig:
    """Build the ReserveConfig from ``site.reserve`` (plus CLI overrides, which win).

    Raises:
        UsageError: unknown key (the message lists valid keys with defaults), wrong type,
            or inconsistent values.
    """
    raw = dict(site.reserve)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    valid = [f.name for f in fields(ReserveConfig) if f.name != "base_dir"]
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        defaults = ReserveConfig()
        listing = ", ".join(f"{k}={getattr(defaults, k)!r}" for k in valid)
        raise UsageError(f"site config reserve: unknown key(s) {unknown}; valid keys with "
                         f"defaults: {listing}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, _TYPES[key]):
            want = "/".join(t.__name__ for t in _TYPES[key])
            raise UsageError(f"site config reserve: {key}={value!r} must be {want}")
    if "train_partitions" in raw:
        parts = raw["train_partitions"]
        if not all(isinstance(p, str) and p for p in parts):
            raise UsageError("site config reserve: train_partitions must be a list of names")
        raw["train_partitions"] = tuple(parts)
    for key in ("quantile", "failure_prob_prior", "prior_weight", "replacement_window_h",
                "history_h", "freshness_h", "repeat_window_h", "lock_timeout_s",
                "call_timeout_s"):
        if key in raw:
            raw[key] = float(raw[key])
    return ReserveConfig(**raw, base_dir=str(Path(site.verdict_log).parent))
