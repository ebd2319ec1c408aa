"""The simulator's event log is the run schema: the report's analysis reads it and
finds the simulator's own ETTR (one analysis code path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_robust.launcher.control.events import INCIDENT_FIELDS
from slurm_robust.records import EVENT_SCHEMA, read_records
from slurm_robust.simulate.config import byterobust_mix, byterobust_times
from slurm_robust.simulate.engine import SimConfig, simulate

from .helpers import GPU, config, incident


def test_report_pipeline_reads_the_simulated_log(tmp_path: Path) -> None:
    from slurm_robust.analysis.pipeline import analyse, load_inputs

    run_dir = tmp_path / "run"
    trace = [incident(1000.5), incident(20000.0, GPU, slot=2, index=1),
             incident(30000.0, GPU, slot=5, index=2)]
    result = simulate(config(trace, spares=1, run_dir=str(run_dir)))
    records = read_records(run_dir / "events.jsonl", EVENT_SCHEMA)
    assert records.malformed == 0
    incidents = [r for r in records.records if r["event"] == "incident"]
    assert [r["rung"] for r in incidents] == ["in_place", "spare", "requeue"]
    assert all(tuple(r)[-len(INCIDENT_FIELDS):] == INCIDENT_FIELDS for r in incidents)
    headline = analyse(load_inputs([run_dir])).headline()
    assert headline["unread"]["total"] == 0
    assert headline["incidents"] == 3
    assert headline["ettr"] == pytest.approx(result.summary["ettr"], abs=1e-9)


def test_step_records_are_sparse(tmp_path: Path) -> None:
    # One day of 10 s steps is 8,640 steps; about one record per simulated minute.
    result = simulate(config([], spares=0, run_dir=str(tmp_path)))
    steps = [r for r in read_records(tmp_path / "events.jsonl", EVENT_SCHEMA).records
             if r["event"] == "step"]
    assert 1440 <= len(steps) <= 1441
    assert steps[-1]["step"] == 8640
    assert result.records == len(read_records(tmp_path / "events.jsonl").records)


def test_default_mix_log_has_no_unreadable_record(tmp_path: Path) -> None:
    from slurm_robust.analysis.pipeline import analyse, load_inputs

    cfg = SimConfig(machines=400, days=10, mix=byterobust_mix(),
                    times=byterobust_times(400), seed=3, run_dir=str(tmp_path))
    result = simulate(cfg)
    assert result.summary["incidents"] > 0
    headline = analyse(load_inputs([tmp_path])).headline()
    assert headline["unread"]["total"] == 0
    assert headline["ettr"] == pytest.approx(result.summary["ettr"], abs=1e-9)
