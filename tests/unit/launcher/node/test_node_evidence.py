"""The agent's evidence gathering (node/evidence.py): task-exit record, kernel log, NVML."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_robust.health.probes import Probes
from slurm_robust.launcher.classify import classify
from slurm_robust.launcher.node.evidence import find_task_exit, gather
from slurm_robust.site_config import SiteConfig


def _record(job: str, pid: int, signal: int | None, code: int | None) -> str:
    return json.dumps({"schema": "slurm_robust.task_exit", "v": 1, "time": 1.0,
                       "node": "n1", "job_id": job, "step_id": "0", "task_id": 0,
                       "local_task_id": 0, "pid": pid, "wait_status": 9,
                       "exit_code": code, "signal": signal, "core_dumped": False,
                       "restart_count": 0})


def test_task_exit_record_matched_by_job_and_pid_from_the_tail(tmp_path):
    journal = tmp_path / "task_exit.jsonl"
    filler = "\n".join(_record("7", 1000 + i, None, 0) for i in range(2000))
    journal.write_text(filler + "\n" + _record("42", 555, 9, None) + "\nnot json\n"
                       + _record("43", 555, None, 3) + "\n")
    found = find_task_exit([tmp_path / "missing.jsonl", journal], "42", 555, 4096)
    assert found is not None and found["signal"] == 9
    assert find_task_exit([journal], "42", 556, 4096) is None
    # Bounded: a record beyond the tail is not read.
    assert find_task_exit([journal], "7", 1000, 4096) is None


def test_gather_feeds_the_classifier_all_sources(tmp_path):
    site = SiteConfig(state_dir=str(tmp_path / "{node}"))
    state = Path(site.state_path("n1"))
    state.mkdir(parents=True)
    (state / "task_exit.jsonl").write_text(_record("42", 555, 9, None) + "\n")
    got = gather(site=site, node="n1", job_id="42", pid=555, exit_code=1, sig=None,
                 log_tail="RuntimeError: CUDA error: unspecified launch failure\n",
                 since_monotonic=None, kernel=[],
                 probes=Probes({"xid_events": [{"gpu": 0, "xid": 79}]}))
    assert got.evidence.task_exit is not None and got.evidence.task_exit["signal"] == 9
    c = classify(got.evidence)
    assert c.cls == "gpu_unavailable" and c.action == "evict" and c.source == "nvml"
    assert c.evidence["signal"] == 9  # the trusted record wins over exit code 1


def test_gather_without_any_source_still_classifies_the_log(tmp_path):
    site = SiteConfig(state_dir=str(tmp_path / "{node}"))
    got = gather(site=site, node="n1", job_id="42", pid=1, exit_code=1, sig=None,
                 log_tail="RuntimeError: CUDA error: an illegal memory access was "
                          "encountered\n", since_monotonic=None, kernel=[],
                 probes=Probes({}))
    assert "task_exit" in got.skipped and "nvml" in got.skipped
    c = classify(got.evidence)
    assert c.cls == "cuda_error" and c.action == "diagnose" and c.side == "unknown"
