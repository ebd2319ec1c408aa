"""Set and clear injected probe values on a node (``<state_dir>/inject.json``).

Refused unless the site config says ``injection_enabled: true``. Writes are atomic
(temp file + rename) and serialised by an ``flock`` on ``inject.json.lock``, so two
concurrent ``inject probe`` calls never lose each other's values and a prolog never
reads half a file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.probes import PROBES, inject_path, read_injections
from slurm_robust.records import write_json_atomic
from slurm_robust.site_config import SiteConfig


class InjectionRefusedError(UsageError):
    """The site has not enabled fault injection."""


@contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / "inject.json.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _require_enabled(config: SiteConfig) -> None:
    if not config.injection_enabled:
        raise InjectionRefusedError(
            "fault injection is disabled on this site; set \"injection_enabled\": true in the "
            "site config ($SLURM_ROBUST_CONFIG) of a test or rehearsal cluster to allow it")


def parse_value(text: str) -> Any:
    """A probe value from the command line: JSON (``79``, ``[{"gpu": 3, "xid": 79}]``)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--value {text!r} is not JSON: {exc}") from exc


def inject_probe(config: SiteConfig, node: str, probe: str, value: Any) -> Path:
    """Make ``probe`` return ``value`` on ``node`` until cleared; returns the file path."""
    _require_enabled(config)
    if probe not in PROBES:
        raise UsageError(f"unknown probe {probe!r}; valid probes: "
                         + "; ".join(f"{k} ({v})" for k, v in PROBES.items()))
    state_dir = config.state_path(node)
    with _locked(state_dir):
        current = read_injections(state_dir)
        current[probe] = value
        write_json_atomic(inject_path(state_dir), current)
    return inject_path(state_dir)


def clear_injections(config: SiteConfig, node: str, probe: str | None = None) -> list[str]:
    """Remove one injected probe (or all); returns the names removed."""
    _require_enabled(config)
    state_dir = config.state_path(node)
    with _locked(state_dir):
        current = read_injections(state_dir)
        removed = [probe] if probe in current else [] if probe else sorted(current)
        for name in removed:
            del current[name]
        path = inject_path(state_dir)
        if current:
            write_json_atomic(path, current)
        elif path.exists():
            path.unlink()
    return removed


def list_injections(config: SiteConfig, node: str) -> dict[str, Any]:
    return read_injections(config.state_path(node))
