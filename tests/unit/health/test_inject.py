"""Probe injection: refused unless enabled, atomic per node, seen by the next suite run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health import Status, run_suite
from slurm_robust.site_config import SiteConfig
from slurm_robust_rehearsal.inject.probes import (
    InjectionRefusedError,
    clear_injections,
    inject_probe,
    list_injections,
)


def test_refused_unless_enabled(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"))
    with pytest.raises(InjectionRefusedError, match="injection_enabled"):
        inject_probe(cfg, "n1", "gpu_count", 3)
    with pytest.raises(InjectionRefusedError):
        clear_injections(cfg, "n1")
    assert not (tmp_path / "n1" / "inject.json").exists()


def test_inject_then_clear_drives_the_real_suite(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True)
    inject_probe(cfg, "node2", "xid_events", [{"gpu": 3, "xid": 79}])
    inject_probe(cfg, "node2", "mem_available_bytes", 1)
    assert set(list_injections(cfg, "node2")) == {"xid_events", "mem_available_bytes"}
    assert list_injections(cfg, "node1") == {}  # per node
    result = run_suite("prolog", "node2", config=cfg, journal=False)
    assert [r.check for r in result.failures] == ["gpu_xid", "host_mem_available"]
    assert clear_injections(cfg, "node2", "mem_available_bytes") == ["mem_available_bytes"]
    assert clear_injections(cfg, "node2") == ["xid_events"]
    assert not (tmp_path / "node2" / "inject.json").exists()
    result = run_suite("prolog", "node2", config=cfg, journal=False)
    assert result.passed
    assert {r.check: r.status for r in result.results}["gpu_xid"] is Status.SKIP


def test_unknown_probe_lists_valid_ones(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True)
    with pytest.raises(UsageError, match="valid probes: gpu_count"):
        inject_probe(cfg, "n1", "gpu_cnt", 3)


def test_cli_round_trip(tmp_path: Path) -> None:
    conf = tmp_path / "site.json"
    conf.write_text(json.dumps({"state_dir": str(tmp_path / "{node}"),
                                "injection_enabled": True}))
    env = {**os.environ, "SLURM_ROBUST_CONFIG": str(conf)}
    cli = [sys.executable, "-m", "slurm_robust.cli.main", "inject"]
    out = subprocess.run([*cli, "probe", "--node", "node2", "--probe", "xid_events",
                          "--value", '[{"gpu": 3, "xid": 79}]'], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout)["probe"] == "xid_events"
    assert json.loads((tmp_path / "node2" / "inject.json").read_text()) == {
        "xid_events": [{"gpu": 3, "xid": 79}]}
    bad = subprocess.run([*cli, "probe", "--node", "node2", "--probe", "gpu_count",
                          "--value", "not json"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "is not JSON" in bad.stderr
    subprocess.run([*cli, "clear", "--node", "node2"], env=env, capture_output=True,
                   timeout=60, check=True)
    assert not (tmp_path / "node2" / "inject.json").exists()


def test_a_leftover_inject_file_is_ignored_when_injection_is_disabled(tmp_path: Path) -> None:
    enabled = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True)
    inject_probe(enabled, "node2", "xid_events", [{"gpu": 3, "xid": 79}])
    disabled = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=False)
    result = run_suite("prolog", "node2", config=disabled, journal=False)
    assert result.passed and not any(r.injected for r in result.results)
    assert not run_suite("prolog", "node2", config=enabled, journal=False).passed
