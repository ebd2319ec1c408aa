"""A node that fails again soon after `node resume` returned it is a repeat offender.

The node programs decide from the node's own health journal (no extra Slurm call).
"""

import json

import pytest

from slurm_robust.health.journal import journal_path
from slurm_robust.node_program import repeat_offender
from slurm_robust.records import HEALTH_SCHEMA, append_records, make_record
from slurm_robust.site_config import load_site_config

HOUR = 3600.0


@pytest.fixture
def site(tmp_path, monkeypatch):
    path = tmp_path / "site.json"
    path.write_text(json.dumps({"state_dir": str(tmp_path / "{node}"),
                                "reserve": {"repeat_window_h": 72}}))
    monkeypatch.setenv("SLURM_ROBUST_CONFIG", str(path))
    return load_site_config()


def _run(site, node, stage, status, t, run_id, reason=""):
    append_records(journal_path(node, site), [make_record(HEALTH_SCHEMA, 1, {
        "node": node, "job": None, "stage": stage, "suite": "quick", "run_id": run_id,
        "check": "gpu_xid", "status": status, "duration_s": 0.01, "reason": reason,
        "evidence": {}, "injected": False}, now=t)])


def test_failure_soon_after_a_resume_is_a_repeat_offender(site):
    t0 = 1_800_000_000.0
    _run(site, "node2", "prolog", "fail", t0, "r1", "gpu_xid: Xid 79 on GPU 3")
    _run(site, "node2", "resume", "ok", t0 + HOUR, "r2")
    _run(site, "node2", "prolog", "fail", t0 + 5 * HOUR, "r3", "gpu_ecc: actual 4")
    reason = repeat_offender("node2", "slurm_robust: gpu_ecc: actual 4", now=t0 + 5 * HOUR)
    assert reason is not None
    assert reason.startswith("slurm_robust: repeat offender: gpu_ecc: actual 4")
    # Flat: the new fault and how soon it came back, no nested earlier reason.
    assert reason.endswith("again 4.0 h after return") and "Xid 79" not in reason


def test_failure_long_after_a_resume_is_not(site):
    t0 = 1_800_000_000.0
    _run(site, "node2", "prolog", "fail", t0, "r1", "gpu_xid: Xid 79 on GPU 3")
    _run(site, "node2", "resume", "ok", t0 + HOUR, "r2")
    assert repeat_offender("node2", "slurm_robust: x", now=t0 + 100 * HOUR) is None


def test_a_failed_resume_check_is_not_a_return(site):
    t0 = 1_800_000_000.0
    _run(site, "node2", "prolog", "fail", t0, "r1", "gpu_xid: Xid 79 on GPU 3")
    _run(site, "node2", "resume", "fail", t0 + HOUR, "r2", "gpu_xid: Xid 79 on GPU 3")
    assert repeat_offender("node2", "slurm_robust: x", now=t0 + 2 * HOUR) is None


def test_first_failure_is_not_a_repeat(site):
    _run(site, "node3", "prolog", "fail", 1_800_000_000.0, "r1", "disk")
    assert repeat_offender("node3", "slurm_robust: disk", now=1_800_000_100.0) is None
