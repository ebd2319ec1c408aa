"""The health journal: one record per check, one append per run, readable by the reserve."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

from slurm_robust.health import Probes, journal_path, last_deep_pass, read_journal, run_suite
from slurm_robust.records import read_records
from slurm_robust.site_config import SiteConfig

QUICK_OFF = {name: {"enabled": False} for name in ("deep_collective", "deep_matmul")}


def cfg_for(tmp_path: Path, **checks: dict) -> SiteConfig:
    return SiteConfig(state_dir=str(tmp_path / "{node}" / "state"), checks=dict(checks))


def test_records_follow_the_schema(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    result = run_suite("prolog", "node2", job="55", config=cfg,
                       probes=Probes({"xid_events": [{"gpu": 3, "xid": 79}]}))
    assert result.journal == tmp_path / "node2" / "state" / "health" / "node2.jsonl"
    recs = read_journal("node2", cfg)
    assert len(recs) == len(result.results)
    xid = next(r for r in recs if r["check"] == "gpu_xid")
    assert {k: xid[k] for k in ("schema", "v", "node", "job", "stage", "suite", "status",
                                "reason", "evidence", "injected")} == {
        "schema": "slurm_robust.health", "v": 1, "node": "node2", "job": "55",
        "stage": "prolog", "suite": "quick", "status": "fail",
        "reason": "gpu_xid: Xid 79 on GPU 3, expected no critical Xid",
        "evidence": {"events": [{"gpu": 3, "xid": 79}]}, "injected": True}
    assert {r["run_id"] for r in recs} == {result.run_id}
    assert all(isinstance(r["duration_s"], float) and isinstance(r["time"], float) for r in recs)
    assert result.reason == "slurm_robust: gpu_xid: Xid 79 on GPU 3, expected no critical Xid"


def test_last_deep_pass_ignores_quick_and_failed_runs(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path, **QUICK_OFF)
    assert last_deep_pass("n1", cfg) is None
    run_suite("prolog", "n1", config=cfg, probes=Probes())
    assert last_deep_pass("n1", cfg) is None  # quick runs do not count
    run_suite("epilog", "n1", config=cfg, probes=Probes({"shm_free_bytes": 0}))
    assert last_deep_pass("n1", cfg) is None  # failed deep run
    ok = run_suite("resume", "n1", config=cfg, probes=Probes())
    t = last_deep_pass("n1", cfg)
    recs = [r for r in read_journal("n1", cfg) if r["run_id"] == ok.run_id]
    assert t == max(r["time"] for r in recs)


def _one_run(state_root: str, i: int) -> None:
    cfg = SiteConfig(state_dir=state_root + "/{node}")
    run_suite("prolog", "n1", job=str(i), config=cfg,
              probes=Probes({"xid_events": [{"gpu": i, "xid": 79}]}))


def test_concurrent_prologs_never_interleave_runs(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_one_run, args=(str(tmp_path), i)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    read = read_records(tmp_path / "n1" / "health" / "n1.jsonl")
    assert read.malformed == 0
    lines = (tmp_path / "n1" / "health" / "n1.jsonl").read_text().splitlines()
    run_ids = [json.loads(line)["run_id"] for line in lines]
    # Each run's records are contiguous: the run id changes exactly 5 times.
    changes = sum(1 for a, b in zip(run_ids, run_ids[1:], strict=False) if a != b)
    assert len(set(run_ids)) == 6 and changes == 5


def test_journal_path_is_per_node(tmp_path: Path) -> None:
    cfg = cfg_for(tmp_path)
    assert journal_path("spare1", cfg) == tmp_path / "spare1/state/health/spare1.jsonl"
