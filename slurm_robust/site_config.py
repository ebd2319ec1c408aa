"""The site configuration: one JSON file an admin writes, read by every root-side program.

Path: ``$SLURM_ROBUST_CONFIG`` or ``/etc/slurm_robust/config.json``; a missing file means
all defaults. Unknown keys are an error that lists the valid ones (a misspelt key must
not be ignored silently). Feature sections (``checks``, ``reserve``) are validated by
their features; this module only checks that they are objects.

String paths may contain ``{node}``, replaced by the Slurm node name, so one file serves
every node and the mini-cluster keeps node-local state apart on one host.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError

CONFIG_ENV = "SLURM_ROBUST_CONFIG"
DEFAULT_CONFIG_PATH = Path("/etc/slurm_robust/config.json")


@dataclass(frozen=True)
class SiteConfig:
    """Site settings.

    Attributes:
        state_dir: node-local state (health journal, injections, locks); ``{node}`` allowed.
        injection_enabled: allow ``slurm-robust inject probe`` on this site (tests, rehearsals).
        gpus_per_node: GPUs each node must have; null means "no GPUs expected", and GPU checks
            are skipped when NVML is absent. Set it on GPU nodes so a node whose driver
            vanished fails instead of skipping.
        shm_root: root of per-job shared-memory checkpoint buffers; ``{node}`` allowed.
        local_root: root of node-local checkpoint files; ``{node}`` allowed.
        verdict_log: where EpilogSlurmctld logs applied and refused verdicts.
        checks: per-check parameters, ``{check_name: {param: value}}`` (see slurm_robust.health).
        reserve: reserve settings (see slurm_robust.reserve).
        monitor: the in-job monitor's schedule and thresholds, ``{kind: {interval_s,
            checks, ...}}`` (see slurm_robust.launcher.node.monitor; {}: the defaults).
        breaker: the drain circuit breaker, ``{max_drains, window_s, dir}`` (see
            slurm_robust.health.breaker; {}: off).
        ledger: the node ledger and the lemon rule, ``{dir, lemon_blames,
            lemon_window_days, ...}`` (see slurm_robust.health.node_ledger; {}: defaults).
        repair: the break-fix loop, ``{rounds, reboot, reboot_command,
            reboot_timeout_s}`` (see slurm_robust.health.repair; {}: one deep check, no
            reboot).
    """

    state_dir: str = "/var/lib/slurm_robust/{node}"
    injection_enabled: bool = False
    gpus_per_node: int | None = None
    shm_root: str = "/dev/shm/slurm_robust/{node}"
    local_root: str = "/var/tmp/slurm_robust/{node}"
    verdict_log: str = "/var/log/slurm_robust/verdicts.jsonl"
    checks: dict[str, Any] = field(default_factory=dict)
    reserve: dict[str, Any] = field(default_factory=dict)
    monitor: dict[str, Any] = field(default_factory=dict)
    breaker: dict[str, Any] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)
    repair: dict[str, Any] = field(default_factory=dict)

    def node_path(self, template: str, node: str) -> Path:
        """Expand ``{node}`` in a path template; refuses node names that could escape it."""
        if not node or "/" in node or node in (".", "..") or "\0" in node:
            raise UsageError(f"invalid node name {node!r}")
        return Path(template.replace("{node}", node))

    def state_path(self, node: str) -> Path:
        return self.node_path(self.state_dir, node)


def config_path() -> Path:
    return Path(os.environ.get(CONFIG_ENV, str(DEFAULT_CONFIG_PATH)))


def load_site_config(path: str | os.PathLike[str] | None = None) -> SiteConfig:
    """Load the site config; defaults when the file does not exist."""
    p = Path(path) if path is not None else config_path()
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        if path is not None:
            raise UsageError(f"site config {p} does not exist") from None
        return SiteConfig()
    except ValueError as exc:
        raise UsageError(f"site config {p} is not valid JSON: {exc}") from exc
    return site_config_from_dict(raw, source=str(p))


def site_config_from_dict(raw: Any, source: str = "<dict>") -> SiteConfig:
    """Build a SiteConfig from a parsed JSON object, rejecting unknown keys and bad types."""
    if not isinstance(raw, dict):
        raise UsageError(f"site config {source} must be a JSON object")
    known = {f.name: f for f in fields(SiteConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        valid = ", ".join(f"{k}={getattr(SiteConfig(), k)!r}" for k in known)
        raise UsageError(f"site config {source}: unknown key(s) {unknown}; valid keys "
                         f"with defaults: {valid}")
    for key, value in raw.items():
        _check_type(key, value, source)
    return SiteConfig(**raw)


def _check_type(key: str, value: Any, source: str) -> None:
    expected: dict[str, tuple[type, ...]] = {
        "state_dir": (str,), "shm_root": (str,), "local_root": (str,), "verdict_log": (str,),
        "injection_enabled": (bool,), "gpus_per_node": (int, type(None)),
        "checks": (dict,), "reserve": (dict,), "monitor": (dict,), "breaker": (dict,),
        "ledger": (dict,), "repair": (dict,),
    }
    ok = isinstance(value, expected[key])
    if key == "gpus_per_node" and isinstance(value, bool):
        ok = False
    if key == "gpus_per_node" and isinstance(value, int) and not isinstance(value, bool):
        ok = value >= 0
    if not ok:
        names = "/".join(t.__name__ for t in expected[key])
        raise UsageError(f"site config {source}: {key}={value!r} must be {names}"
                         + (" >= 0" if key == "gpus_per_node" else ""))
