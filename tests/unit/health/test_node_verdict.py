"""The verdict document: one per suite run, written by the suite, read by the exporter, its
level and exit code by Health Validation's convention. Runs the real checks; the node's
readings come through the probe layer (its documented injection point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust.health import run_suite
from slurm_robust.health.node_verdict import (
    VERDICT_SCHEMA,
    Severity,
    document_path,
    read_document,
)
from slurm_robust.health.probes import Probes, inject_path
from slurm_robust.site_config import CONFIG_ENV, SiteConfig
from tests.unit.health.test_node_deep_check import LIGHT


def site_at(tmp_path: Path, shm_policy: str = "open") -> SiteConfig:
    checks = {**LIGHT, "deep_shm_free": {"on_error": shm_policy}}
    return SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True,
                      checks=checks)


def test_a_failed_check_is_critical_with_its_next_steps_and_is_written(tmp_path: Path) -> None:
    site = site_at(tmp_path)
    result = run_suite("epilog", "n1", job="5", config=site,
                       probes=Probes({"shm_free_bytes": 0}))
    doc = result.verdict
    assert doc is not None and doc["schema"] == VERDICT_SCHEMA and doc["v"] == 1
    assert (doc["severity"], doc["exit_code"]) == ("CRITICAL", 1)
    shm, = [c for c in doc["checks"] if c["check"] == "deep_shm_free"]
    assert shm["severity"] == "CRITICAL" and shm["reason"].startswith("deep_shm_free: ")
    assert shm["actions"] and shm["actions"][0] in doc["actions"]
    assert doc["counts"]["CRITICAL"] == 1
    # Without NVML the GPU checks are skipped: INFO, never a pass of an unread GPU.
    assert {c["severity"] for c in doc["checks"] if c["check"].startswith("gpu_")} == {"INFO"}
    assert read_document("n1", site) == json.loads(document_path("n1", site).read_text())
    assert read_document("n1", site)["run_id"] == result.run_id


def test_a_node_without_failures_exits_zero_at_its_worst_check_level(tmp_path: Path) -> None:
    # This machine's own readings (a loaded machine may warn); no GPU: at least INFO.
    doc = run_suite("prolog", "n1", config=site_at(tmp_path), probes=Probes({})).verdict
    assert doc is not None and doc["exit_code"] == 0
    levels = {c["severity"] for c in doc["checks"]}
    assert "CRITICAL" not in levels and "INFO" in levels
    assert doc["severity"] == ("WARNING" if "WARNING" in levels else "INFO")
    assert doc["actions"] == []


@pytest.mark.parametrize(("policy", "severity", "code"), [("open", "WARNING", 0),
                                                          ("closed", "UNKNOWN", 1)])
def test_a_check_that_cannot_run_is_unknown_and_counts_by_its_policy(
        tmp_path: Path, policy: str, severity: str, code: int) -> None:
    doc = run_suite("epilog", "n1", config=site_at(tmp_path, policy),
                    probes=Probes({"shm_free_bytes": "lots"})).verdict
    assert doc is not None
    shm, = [c for c in doc["checks"] if c["check"] == "deep_shm_free"]
    assert shm["severity"] == "UNKNOWN" and shm["on_error"] == policy
    assert (doc["severity"], doc["exit_code"]) == (severity, code)


@pytest.mark.parametrize("content", [b"not json", b'{"schema": "other", "v": 1}',
                                     b'{"schema": "slurm_robust.node_verdict", "v": 1, '
                                     b'"severity": "FINE"}', b" " * (2 << 20)])
def test_a_document_that_is_not_one_is_ignored(tmp_path: Path, content: bytes) -> None:
    site = site_at(tmp_path)
    path = document_path("n1", site)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert read_document("n1", site) is None
    assert read_document("n2", site) is None  # none written yet


def test_check_exits_by_the_verdict_and_prints_the_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    state = tmp_path / "state" / "{node}"
    config.write_text(json.dumps({"state_dir": str(state), "injection_enabled": True,
                                  "checks": LIGHT}))
    monkeypatch.setenv(CONFIG_ENV, str(config))
    assert main(["check", "--node", "n1", "--stage", "epilog", "--verdict"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["severity"] in ("PASS", "INFO") and doc["stage"] == "manual"
    inject = inject_path(Path(str(state).replace("{node}", "n1")))
    inject.write_text('{"shm_free_bytes": 0}')
    assert main(["check", "--node", "n1", "--stage", "epilog"]) == 1
    out = capsys.readouterr().out
    assert "(CRITICAL)" in out and "\nnext: " in out
    assert read_document("n1", SiteConfig(state_dir=str(state)))["severity"] == \
        Severity.CRITICAL
