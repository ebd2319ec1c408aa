"""Resource checks judge the node, not its neighbours: a shortfall of /tmp, memory or
/dev/shm that other users' files or processes explain is a warning naming their uids,
not a drain; and a drain for a shortfall alone is never a repeat offender."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from slurm_robust import node_program
from slurm_robust.health import Probes, Status, run_suite
from slurm_robust.health.journal import journal_path
from slurm_robust.health.probes import _disk_usage_by_uid
from slurm_robust.records import HEALTH_SCHEMA, append_records, make_record
from slurm_robust.site_config import SiteConfig, load_site_config

GIB = 1 << 30
JOB_UID = 1600
MALLORY = 1700


@pytest.fixture()
def cfg(tmp_path: Path) -> SiteConfig:
    return SiteConfig(state_dir=str(tmp_path / "{node}" / "state"), injection_enabled=True)


def _suite(cfg: SiteConfig, suite: str = "prolog", **injected: object) -> dict:
    result = run_suite(suite, "n1", job="7", config=cfg, probes=Probes(injected),
                       journal=False, job_uid=JOB_UID)
    return {r.check: r for r in result.results}


def test_tmp_filled_by_another_user_warns_naming_the_uid(cfg):
    r = _suite(cfg, disk_free_bytes={"/tmp": GIB // 4},
               disk_usage_by_uid={"/tmp": {str(MALLORY): 3 * GIB, "0": GIB}})["host_disk_free"]
    assert r.status is Status.WARN, r.reason
    assert f"other users (uids {MALLORY})" in r.reason and "not drained" in r.reason
    assert r.evidence["other_uids"] == {str(MALLORY): 3 * GIB}


def test_tmp_filled_by_the_jobs_own_user_or_root_still_fails(cfg):
    for owner in (JOB_UID, 0, 999):  # the job's user, root, a system account
        r = _suite(cfg, disk_free_bytes={"/tmp": GIB // 4},
                   disk_usage_by_uid={"/tmp": {str(owner): 5 * GIB}})["host_disk_free"]
        assert r.status is Status.FAIL, (owner, r.reason)


def test_a_shortfall_others_explain_only_in_part_fails(cfg):
    r = _suite(cfg, disk_free_bytes={"/tmp": 0},
               disk_usage_by_uid={"/tmp": {str(MALLORY): GIB // 2}})["host_disk_free"]
    assert r.status is Status.FAIL and r.evidence["other_uids"] == {str(MALLORY): GIB // 2}


def test_an_injected_full_disk_without_usage_still_fails(cfg):
    # A rehearsal that injects only the free space is not second-guessed by a real walk.
    r = _suite(cfg, disk_free_bytes={"/tmp": GIB // 4})["host_disk_free"]
    assert r.status is Status.FAIL


def test_memory_held_by_another_users_processes_warns(cfg):
    res = _suite(cfg, mem_available_bytes=GIB // 4,
                 mem_by_uid={str(MALLORY): 2 * GIB, str(JOB_UID): 8 * GIB})
    r = res["host_mem_available"]
    assert r.status is Status.WARN and str(MALLORY) in r.reason
    assert str(JOB_UID) not in r.evidence["other_uids"]
    res = _suite(cfg, mem_available_bytes=GIB // 4, mem_by_uid={str(JOB_UID): 8 * GIB})
    assert res["host_mem_available"].status is Status.FAIL


def test_shm_filled_by_another_user_warns_in_the_deep_suite(tmp_path):
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}" / "state"), injection_enabled=True,
                     checks={"deep_collective": {"enabled": False}})
    r = _suite(cfg, "epilog", shm_free_bytes=GIB // 8,
               disk_usage_by_uid={"/dev/shm": {str(MALLORY): 4 * GIB}})["deep_shm_free"]
    assert r.status is Status.WARN and str(MALLORY) in r.reason


def test_the_usage_walk_counts_by_owner_without_following_links(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "big").write_bytes(b"x" * (1 << 20))
    (tmp_path / "theirs").write_bytes(b"y" * (1 << 20))
    (tmp_path / "link").symlink_to("/usr")
    if os.geteuid() == 0:
        os.chown(tmp_path / "theirs", MALLORY, -1)
    got = _disk_usage_by_uid(str(tmp_path))
    assert got.get(os.geteuid(), 0) >= 1 << 20
    if os.geteuid() == 0:
        assert got[MALLORY] >= 1 << 20
    assert sum(got.values()) < 64 << 20  # /usr behind the link was not walked


# ------------------------------------------------------------------ repeat offender
@pytest.fixture()
def site(tmp_path, monkeypatch):
    path = tmp_path / "site.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "{node}"),
                                "injection_enabled": True,
                                "checks": {"deep_collective": {"enabled": False}},
                                "reserve": {"repeat_window_h": 72}}))
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(path))
    return load_site_config()


def _returned_recently(site, node: str) -> None:
    t0 = 1_800_000_000.0
    for stage, status, t in (("prolog", "fail", t0), ("resume", "ok", t0 + 3600)):
        append_records(journal_path(node, site), [make_record(HEALTH_SCHEMA, 1, {
            "node": node, "job": None, "stage": stage, "suite": "quick", "run_id": stage,
            "check": "gpu_xid", "status": status, "duration_s": 0.01,
            "reason": "gpu_xid: Xid 79", "evidence": {}, "injected": False}, now=t)])


def _prolog(site, tmp_path, monkeypatch, injected: dict) -> str:
    state = tmp_path / "node2"
    state.mkdir(exist_ok=True)
    (state / "inject.json").write_text(json.dumps(injected))
    drained: list[str] = []

    class Decision:
        action, why = "drained", "test"

    monkeypatch.setattr(node_program, "drain_for_failure",
                        lambda node, reason: drained.append(reason) or Decision())
    # Five hours after the return (the repeat rule's clock; the global time is left alone).
    rule = node_program.repeat_offender
    monkeypatch.setattr(node_program, "repeat_offender",
                        lambda node, reason: rule(node, reason, now=1_800_000_000.0 + 5 * 3600))
    env = {"SLURMD_NODENAME": "node2", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_UID": str(JOB_UID)}
    assert node_program.main("prolog", env, out=io.StringIO(), err=io.StringIO()) == 1
    return drained[0]


def test_a_resource_drain_after_a_resume_is_not_a_repeat_offender(site, tmp_path,
                                                                  monkeypatch):
    _returned_recently(site, "node2")
    reason = _prolog(site, tmp_path, monkeypatch,
                     {"disk_free_bytes": {"/tmp": 0}, "disk_usage_by_uid": {"/tmp": {}}})
    assert reason.startswith("slurm_robust: host_disk_free:"), reason
    assert "repeat offender" not in reason


def test_a_hardware_failure_after_a_resume_still_is(site, tmp_path, monkeypatch):
    _returned_recently(site, "node2")
    reason = _prolog(site, tmp_path, monkeypatch, {"xid_events": [{"gpu": 0, "xid": 79}]})
    assert "repeat offender" in reason
