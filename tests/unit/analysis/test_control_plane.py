"""Controller takeovers and overloads reach the post-mortem: read (never unread input)
as the Control plane table, which a run with one quiet controller does not show."""

from __future__ import annotations

from pathlib import Path

from slurm_robust.analysis.pipeline import analyse, load_inputs
from slurm_robust.analysis.report import sections
from tests.unit.analysis.run_helpers import started_run


def test_controller_takeovers_and_overloads_are_read_into_the_control_plane_table(
        tmp_path: Path) -> None:
    run, log = started_run(tmp_path)
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
    run, _ = started_run(tmp_path, steps=1)
    an = analyse(load_inputs([run]))
    assert an.control_plane.empty
    assert "Control plane" not in [title for title, _, _ in sections(an)]
