"""The post-mortem's allocation table, from a run recorded on the mini-cluster (a run
longer than its time limit: four allocations) and from hand-made boundaries the recorded
run does not have (an admin's requeue, a restart from scratch)."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_robust.analysis.allocations import allocation_table, boundary_summary
from slurm_robust.analysis.frames import LoadIssues
from slurm_robust.analysis.loaders import load_run_dirs
from slurm_robust.analysis.pipeline import analyse, load_inputs
from slurm_robust.analysis.report import write_report

RECORDED = Path(__file__).parents[2] / "data" / "runs" / "time_limit_3_allocations"


def test_a_run_over_its_time_limit_is_four_allocations_each_ended_by_the_limit() -> None:
    t = allocation_table(load_run_dirs([RECORDED], LoadIssues()))
    assert list(t["attempt"]) == [0, 1, 2, 3]
    assert list(t["ended_by"]) == ["time_limit"] * 3 + ["completed"]
    # Each allocation went on from the newest step of the one before: nothing redone.
    assert list(t["restored_step"].iloc[1:]) == list(t["last_step"].iloc[:-1])
    assert list(t["steps_redone"].iloc[:-1]) == [0, 0, 0]
    assert (t["boundary_s"].iloc[:-1] > 0).all() and t["boundary_s"].isna().iloc[-1]
    assert t["last_step"].iloc[-1] == 60 and (t["nodes"] == 3).all()
    s = boundary_summary(t)
    assert (s["allocations"], s["boundaries"], s["steps_redone_at_boundaries"]) == (4, 3, 0)
    assert s["boundary_h"] * 3600 == t["boundary_s"].sum()


def _event(run: str, attempt: int, t: float, event: str, **fields: object) -> str:
    return json.dumps({"schema": "slurm_robust.event", "v": 1, "time": t, "run_id": run,
                       "job_id": "7", "attempt": attempt, "event": event, **fields})


def test_an_unannounced_requeue_and_a_restart_from_scratch(tmp_path: Path) -> None:
    lines = [_event("r", 0, 0.0, "run_start", nodes=["a"], world_size=1),
             _event("r", 0, 0.0, "attempt_start", nodes=["a"], restored_step=None),
             *[_event("r", 0, float(i), "step", step=i) for i in range(1, 6)],
             # An admin's scontrol requeue: no incident logged, restored from step 5.
             _event("r", 1, 20.0, "attempt_start", nodes=["a"], restored_step=5,
                    restore_tier="durable"),
             *[_event("r", 1, 20.0 + i, "step", step=5 + i) for i in range(1, 4)],
             # Then a requeue with nothing to restore.
             _event("r", 2, 40.0, "attempt_start", nodes=["b"], restored_step=None),
             _event("r", 2, 41.0, "step", step=1)]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    t = allocation_table(load_run_dirs([tmp_path], LoadIssues()))
    assert list(t["ended_by"]) == ["requeue", "requeue", "running"]
    assert list(t["boundary_s"].iloc[:2]) == [16.0, 18.0]
    assert list(t["steps_redone"].iloc[:2]) == [0.0, 8.0]
    assert t["to_first_step_s"].iloc[1] == 1.0


def test_the_report_has_the_allocations_and_the_headline_their_cost(tmp_path: Path) -> None:
    an = analyse(load_inputs([str(RECORDED)]))
    assert an.headline()["allocations"]["boundaries"] == 3
    md = write_report(an, tmp_path / "report")["md"].read_text()
    assert "## Allocations" in md and "time_limit" in md
