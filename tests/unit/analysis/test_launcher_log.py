"""The report over an event log written by the launcher's own writer (EventLog).

Until the mini-cluster fault scenario lands, this pins the contract between the two
features: what slurm_robust.launcher.control.events writes is what the analysis reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.cli.main import main
from slurm_robust.launcher.control.events import INCIDENT_FIELDS, EventLog, make_incident

T0 = 1_750_000_000.0


def _write_run(path: Path) -> None:
    # The writer stamps records with the wall clock unless given ``now``; a fake clock
    # needs ``emit(..., now=t)`` for the records whose helpers take no ``now``.
    log = EventLog(path / "events.jsonl", "run-x", "42", max_per_s=0)
    log.emit("run_start", {"nodes": ["node1", "node2"], "spares": ["spare1"],
                           "world_size": 2, "layout": {"tp": 1, "pp": 1, "dp": 2},
                           "config": {}}, now=T0)
    t = T0 + 5
    log.emit("attempt_start", {"nodes": ["node1", "node2"], "restored_step": None,
                               "restore_tier": None}, now=t)
    faults = {4: ("worker_crash", "explicit", "in_place", ["node2"], 3),
              8: ("node_lost", "explicit", "spare", ["node2"], 8),
              11: ("hang", "implicit", "requeue", [], 10)}
    step = 0
    first_of_attempt = True
    while step < 14:
        step += 1
        t += 10.0
        log.step(step, None if first_of_attempt else 10.0, 2.0 / step, 1.0, now=t)
        first_of_attempt = False
        if step in faults:
            cls, cat, rung, nodes, restored = faults.pop(step)
            inc = make_incident(f"i{step}", cls, cat, t + 3, fault_time=t + 1, nodes=nodes,
                                last_step=step)
            log.attempt += 1
            t += 30.0
            log.emit("attempt_start", {"nodes": ["node1", "spare1"],
                                       "restored_step": restored, "restore_tier": "memory"},
                     now=t)
            t += 10.0
            inc.update(localized_at=inc["detected_at"] + 1, recovered_at=t, rung=rung,
                       restored_step=restored, restore_tier="memory",
                       steps_lost=step - restored)
            step = restored + 1
            log.step(step, None, 2.0 / step, 1.0, now=t)
            log.emit("incident", {k: inc[k] for k in INCIDENT_FIELDS}, now=t)
    log.emit("run_end", {"status": "completed", "step": 14, "params_sha256": "0" * 64,
                         "verdict": ""}, now=t)


def test_report_reads_the_launcher_writer(tmp_path: Path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_run(run_dir)
    assert main(["report", str(run_dir), "-o", str(tmp_path / "out"), "--json"]) == 0
    head = json.loads(capsys.readouterr().out)
    assert head["unread"]["total"] == 0, head["unread"]
    assert head["incidents"] == 3
    # legacy names (hang, worker_crash) are read as their taxonomy classes
    assert head["by_class"] == {"job_hang": 1, "node_lost": 1, "worker_signal": 1}
    assert head["by_rung"] == {"in_place": 1, "spare": 1, "requeue": 1, "stop": 0}
    assert head["steps_redone"] == 1 + 0 + 1  # steps 4, then 11
    assert head["mean_time_to_detect_s"] == pytest.approx(2.0)
    assert head["repeat_offenders"] == ["node2"]
    assert 0.0 < head["ettr"] < 1.0
