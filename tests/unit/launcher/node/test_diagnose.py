"""Stop-time diagnosis of a suspected node, through the real checks on injected probes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from slurm_robust.health.framework import Status
from slurm_robust.health.journal import read_journal
from slurm_robust.health.probes import Probes
from slurm_robust.launcher.diagnose import SELF_TEST, SUITE, NextStep, diagnose, next_step
from slurm_robust.site_config import SiteConfig


@pytest.fixture()
def cfg(tmp_path: Path) -> SiteConfig:
    return SiteConfig(state_dir=str(tmp_path / "{node}" / "state"), injection_enabled=True)


def test_healthy_node_passes_with_quick_checks_and_self_test(cfg: SiteConfig):
    # A smaller copy than the shipped self-test's: starved by a loaded test machine,
    # the 32 MiB one has overrun its 10 s budget.
    d = diagnose("n1", config=cfg, probes=Probes({}), budget_s=60.0,
                 self_test={**SELF_TEST, "deep_membw": {"mib": 8}})
    ran = {r.check: r.status for r in d.results}
    not_ok = [r for r in d.results if r.status is not Status.OK]
    assert d.passed and d.complete and d.reason == "", not_ok
    assert {"host_disk_free", "gpu_xid", "deep_matmul", "deep_membw"} <= set(ran)
    assert ran["deep_matmul"] is Status.OK  # the self-test really ran, on the CPU
    assert "deep_disk_io" not in ran  # the rest of the deep suite is not part of it
    assert 0 < d.elapsed_s < 60.0
    assert next_step(d, same_signature_after_pass=False) is NextStep.REATTEMPT
    assert next_step(d, same_signature_after_pass=True) is NextStep.STOP_USER
    journal = read_journal("n1", cfg)
    assert {r["suite"] for r in journal} == {SUITE} and len(journal) == len(d.results)


def test_injected_xid_79_fails_and_evicts_with_the_xid_as_evidence(cfg: SiteConfig):
    # The quick checks only: the self-test's timed copies, starved by a loaded machine,
    # can overrun their budget and add a failure of their own to the reason.
    d = diagnose("n2", config=cfg, probes=Probes({"xid_events": [{"gpu": 1, "xid": 79}]}),
                 journal=False, self_test={})
    assert not d.passed
    assert d.reason == "diagnosis: gpu_xid: Xid 79 on GPU 1, expected no critical Xid"
    ev = d.evidence()
    assert ev["failed"][0]["evidence"] == {"events": [{"gpu": 1, "xid": 79}]}
    assert next_step(d, same_signature_after_pass=True) is NextStep.EVICT


def test_spent_budget_leaves_checks_unrun_but_blames_nobody(cfg: SiteConfig):
    ticks = itertools.count(0.0, 1.0)  # every clock read is one second later
    d = diagnose("n3", config=cfg, probes=Probes({}), budget_s=3.0, journal=False,
                 clock=lambda: next(ticks))
    assert not d.complete and d.passed
    skipped = [r for r in d.results if "diagnosis budget of 3 s spent" in r.reason]
    assert skipped and all(r.status is Status.SKIP for r in skipped)
    assert d.elapsed_s >= 3.0
