"""DCGM diagnostics: the ``dcgmi diag -j`` reader on both layouts NVIDIA has printed, and
the dcgm_diag check through the real suite with its reading injected (the documented
``dcgm_diag`` probe; no dcgmi on this machine).

The layouts follow public references where there are some: the per-GPU result fields
(``name``, ``results``, ``status``, ``info``, ``gpu_ids``, ``warnings``) are the ones
NVIDIA's own DCGM test scripts read, and DCGM 4's per-test ``test_summary.status`` under
``"DCGM Diagnostic".test_categories[]`` is what
``jq '."DCGM Diagnostic".test_categories[]|...|.tests[].test_summary.status'`` reads in
github.com/junli-nv/aihpc_val (validation/dcgmi/aly.sh). DCGM 4's per-result fields
(``entity_id``, warnings as objects) are assumed here, not seen: the reader takes the
test summary's status first, so a different per-result shape changes only the ``info``
text. Not yet run against a real dcgmi (no GPU machine was lent).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.health.dcgm import parse_diag, run_diag
from slurm_robust.health.framework import Status
from slurm_robust.health.probes import Probes
from slurm_robust.health.suite import run_suite
from slurm_robust.site_config import SiteConfig
from tests.unit.health.test_node_deep_check import LIGHT

DCGM3 = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"status": "Pass"}]},
        {"name": "Persistence Mode", "results": [{"status": "Pass"}]}]},
    {"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [
            {"gpu_ids": "0", "status": "Pass"},
            {"gpu_ids": "3", "status": "Fail",
             "info": "Error: DCGM_FR_FAULTY_MEMORY: 12 faulty memory pages detected"}]},
        {"name": "Diagnostic", "results": [{"gpu_ids": "1", "status": "Warn",
                                            "warnings": ["Clocks are being throttled"]}]}]},
    {"category": "Stress", "tests": [
        {"name": "Targeted Power", "results": [{"status": "Skip"}]}]}]}}

DCGM4 = {"version": "4.1.1", "DCGM Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "software", "test_summary": {"status": "Pass"},
         "results": [{"entity_id": 0, "status": "Pass"}]}]},
    {"category": "Integration", "tests": [
        {"name": "pcie", "test_summary": {"status": "Fail"},
         "results": [{"entity_id": 5, "status": "Fail",
                      "warnings": [{"warning": "PCIe replay count 212 above 50"}]}]}]}]}}


def test_both_layouts_are_read():
    v3 = {t["name"]: t for t in parse_diag("Successfully ran diag\n" + json.dumps(DCGM3))}
    assert v3["GPU Memory"]["status"] == "fail" and v3["GPU Memory"]["category"] == "Hardware"
    assert v3["GPU Memory"]["info"] == \
        "GPU 3: Error: DCGM_FR_FAULTY_MEMORY: 12 faulty memory pages detected"
    assert v3["Diagnostic"]["status"] == "warn"
    assert v3["Diagnostic"]["info"] == "GPU 1: Clocks are being throttled"
    assert (v3["Denylist"]["status"], v3["Targeted Power"]["status"]) == ("ok", "skip")
    v4 = {t["name"]: t for t in parse_diag(json.dumps(DCGM4))}
    assert v4["pcie"]["status"] == "fail"
    assert v4["pcie"]["info"] == "GPU 5: PCIe replay count 212 above 50"
    for bad in ("Error: unable to connect to host engine", '{"other": {}}'):
        with pytest.raises(ValueError, match="dcgmi diag"):
            parse_diag(bad)


def test_without_dcgmi_there_is_no_reading(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert run_diag(1, 5.0) is None


def suite(tmp_path: Path, stage: str, reading, levels=None):
    checks = dict(LIGHT)
    if levels is not None:
        checks["dcgm_diag"] = {"levels": levels}
    site = SiteConfig(state_dir=str(tmp_path / "{node}"), checks=checks)
    result = run_suite(stage, "n1", config=site, probes=Probes({"dcgm_diag": reading}),
                       journal=False)
    return {r.check: r for r in result.results}["dcgm_diag"], result


def test_the_level_follows_the_stage_and_a_failed_test_fails_the_node(tmp_path):
    tests = [{"name": "GPU Memory", "category": "Hardware", "status": "fail",
              "info": "GPU 3: 12 faulty memory pages"}]
    res, result = suite(tmp_path, "resume", {"level": 2, "rc": 226, "tests": tests})
    assert res.status is Status.FAIL and res.evidence["level"] == 2
    assert res.reason == "dcgm_diag: level 2: GPU Memory failed: GPU 3: 12 faulty memory pages"
    assert not result.admits
    res, _ = suite(tmp_path, "reserve", {"level": 1, "rc": 0, "tests": [
        {"name": "Denylist", "category": "Deployment", "status": "ok", "info": ""}]})
    assert res.status is Status.OK and res.evidence["level"] == 1
    res, _ = suite(tmp_path, "epilog", {"level": 1, "rc": 0, "tests": []})
    assert res.status is Status.SKIP  # no level for the epilog by default
    res, _ = suite(tmp_path, "epilog", {"level": 1, "rc": 0, "tests": [
        {"name": "pcie", "category": "Integration", "status": "warn", "info": "x"}]},
        levels={"epilog": 1})
    assert res.status is Status.WARN and res.evidence["level"] == 1


def test_no_dcgmi_skips_and_an_empty_report_is_unknown(tmp_path):
    res, result = suite(tmp_path, "resume", None)
    assert res.status is Status.SKIP and result.admits
    res, result = suite(tmp_path, "resume", {"level": 2, "rc": 0, "tests": []})
    assert res.status is Status.ERROR and result.admits  # fail-open by default
