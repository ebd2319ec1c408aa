"""bench phases' pure parts: its section options and the figures it reads from a run."""

from __future__ import annotations

import json

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.control.state import RunState, save_state
from slurm_robust_rehearsal.bench import phases as bench_phases


def test_section_options_are_checked():
    assert bench_phases._section("eval", "200:60") == "eval:200:60"
    for bad in ("200", "0:60", "x:60", "200:x", "200:-1"):
        with pytest.raises(UsageError, match="EVERY:SECONDS"):
            bench_phases._section("save", bad)


def _event(t: float, event: str, **fields) -> str:
    return json.dumps({"schema": "slurm_robust.event", "v": 1, "time": t,
                       "run_id": "r", "job_id": "7", "attempt": 0, "event": event,
                       **fields})


def test_figures_count_incidents_and_show_the_learned_limits(tmp_path):
    lines = [_event(100.0, "run_start"), _event(101.0, "step", step=1),
             _event(160.0, "incident", incident="r-1", rung="in_place", nodes=["n1"],
                    ranks=[0], steps_lost=0, restore_tier="memory", detected_at=160.0,
                    recovered_at=170.0, **{"class": "job_hang"}),
             _event(200.0, "step", step=2), "not json",
             _event(230.0, "run_end", status="completed")]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    state = RunState()
    state.declares_phases = True
    state.hang_limits = {"steps": 3.0, "eval": 180.0}
    state.phase_times = {"eval": [59.8, 60.2], "steps": [0.5, 0.51], "save": []}
    save_state(tmp_path / "state.json", state)
    got = bench_phases._figures("7", tmp_path)
    assert got["incidents"] == 1 and got["incident_classes"] == ["job_hang"]
    assert got["wall_s"] == 100.0 and got["last_step"] == 2
    assert got["declares_phases"] and got["hang_limits_s"] == {"steps": 3.0, "eval": 180.0}
    assert got["phase_times"] == {"eval": {"n": 2, "max_s": 60.2},
                                  "steps": {"n": 2, "max_s": 0.51}}
