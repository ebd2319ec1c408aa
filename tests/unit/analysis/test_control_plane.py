"""Controller takeovers and overloads reach the post-mortem: read (never unread input)
as the Control plane table, which a run with one quiet controller does not show."""

from __future__ import annotations

from pathlib import Path

from slurm_robust.analysis.pipeline import analyse, load_inputs
from slurm_robust.analysis.report import sections
from slurm_robust.launcher.control.events import EventLog


def test_controller_takeovers_and_overloads_are_read_into_the_control_plane_table(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = EventLog(run / "events.jsonl", "r1", "7", 0, 1000.0)
    log.emit("run_start", {"nodes": ["n1", "n2"], "spares": [], "world_size": 2}, now=99.0)
    log.emit("attempt_start", {"nodes": ["n1", "n2"], "restored_step": None}, now=100.0)
    for step in range(1, 6):
        log.step(step, 1.0, 0.5, 1.0, force=True, now=100.0 + step)
    # What the controller writes (control/overload.py, succession.py), through its writers.
    log.controller_overload({"overload_version": 1, "lag_s": 5.8, "episodes": 1,
                             "late_s": 5.8, "since": 101.5, "agents": 2}, now=107.5)
    log.controller(2, "n2", 1, {"controller_lost": True, "detected_by": "n2",
                                "previous_term": 1, "term": 2, "previous_agent": 0,
                                "lease_age_s": 4.2, "slurm_node_state": "down"})

    an = analyse(load_inputs([run]))
    assert an.issues.total == 0  # neither event is counted as unknown input
    table = an.control_plane
    assert list(table["event"]) == ["overload", "takeover"]
    over, take = table.to_dict("records")
    assert (over["lag_s"], over["episodes"], over["agents"]) == (5.8, 1, 2)
    assert (take["term"], take["node"], take["replaced_agent"]) == (2, "n2", 0)
    assert "Control plane" in [title for title, _, _ in sections(an)]


def test_a_run_with_one_controller_and_no_overload_has_no_control_plane_section(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = EventLog(run / "events.jsonl", "r1", "7", 0, 1000.0)
    log.emit("run_start", {"nodes": ["n1"], "spares": [], "world_size": 1}, now=99.0)
    log.step(1, 1.0, 0.5, 1.0, force=True, now=101.0)
    an = analyse(load_inputs([run]))
    assert an.control_plane.empty
    assert "Control plane" not in [title for title, _, _ in sections(an)]
