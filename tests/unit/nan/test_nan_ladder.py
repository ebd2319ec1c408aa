"""The NaN ladder's pure parts: attribution from the ranks' anomaly lines, and the
decision per incident (reattempt, then stop/skip for a NaN that returns at the same
place, rollback for one that moves)."""

from __future__ import annotations

import json

import pytest

from slurm_robust.launcher.control.nan_ladder import (
    CLEAN_STEPS,
    NanLadder,
    NanOrigin,
    NanPolicy,
    NanResolution,
    attribute,
    write_skips,
)
from slurm_robust.launcher.control.state import RunState
from slurm_robust.launcher.node.nan_local import skipped_steps

NODES = ["node1", "node2", "node3"]


def _line(step, local, name=None, pos=None):
    out = {"what": "nan", "step": step, "name": "grad_norm"}
    if local is not None:
        out.update(local=local, local_name=name, data_position=pos)
    return out


def test_origin_is_the_rank_that_had_it_locally_not_the_first_reporter():
    lines = {0: _line(31, False), 1: _line(31, False), 2: _line(31, True, "loss", 30)}
    origin = attribute(lines, NODES)
    assert origin.ranks == (2,) and origin.nodes == ("node3",)
    assert origin.step == 31 and origin.data_position == 30
    assert origin.describe() == "node3 rank 2"


def test_earliest_local_step_wins():
    lines = {0: _line(12, True, "local_grad_norm"), 1: _line(11, True, "loss"),
             2: _line(12, False)}
    assert attribute(lines, NODES).ranks == (1,)


def test_no_local_check_is_origin_unknown_and_names_no_node():
    origin = attribute({0: _line(5, None), 2: _line(5, None)}, NODES)
    assert not origin.known and origin.nodes == () and origin.step == 5
    assert "local_check" in origin.reason and origin.describe() == "origin unknown"


def test_all_finite_before_the_collective_is_unknown_too():
    origin = attribute({0: _line(5, False), 1: _line(5, False)}, NODES)
    assert not origin.known and "after" in origin.reason


def test_spikes_are_not_nan_origins():
    lines = {0: {"what": "loss_spike", "step": 3, "local": True}}
    assert not attribute(lines, NODES).known


def _origin(step, rank):
    return NanOrigin(step, (rank,), (NODES[rank],), step - 1, "x")


def test_first_nan_reattempts_and_a_passed_replay_ends_the_episode():
    ladder = NanLadder()
    assert ladder.decide(_origin(31, 2), 0.0).resolution is NanResolution.REATTEMPT
    ladder.on_step(31 + CLEAN_STEPS)
    assert ladder.decide(_origin(31, 2), 5.0).resolution is NanResolution.REATTEMPT


def test_a_nan_soon_after_the_replay_passed_is_the_same_one_moving():
    """Corruption at random steps: the replay passes step 31, the NaN shows at 35, then
    at 33 after the rollback. Counted as new episodes it would be reattempted for ever."""
    ladder = NanLadder()
    ladder.decide(_origin(31, 2), 0.0)
    ladder.on_step(34)
    assert ladder.decide(_origin(35, 2), 3.0).resolution is NanResolution.ROLLBACK
    ladder.on_step(32)
    step = ladder.decide(_origin(33, 2), 6.0)
    assert step.resolution is NanResolution.REPLAY and step.verdict == "sdc_suspected"
    assert ladder.steps == [31, 35, 33]


def test_same_place_again_stops_with_step_and_data_position():
    ladder = NanLadder(NanPolicy.STOP)
    ladder.decide(_origin(31, 2), 0.0)
    ladder.on_step(30)  # the replay got as far as the step before
    step = ladder.decide(_origin(31, 2), 4.0)
    assert step.resolution is NanResolution.STOP and step.verdict == "data_or_model"
    assert "step 31" in step.reason and "data position 30" in step.reason
    assert step.replay_s == 4.0


def test_same_place_again_skips_under_the_skip_policy(tmp_path):
    ladder = NanLadder(NanPolicy.SKIP)
    ladder.decide(_origin(31, 2), 0.0)
    step = ladder.decide(_origin(31, 2), 1.0)
    assert step.resolution is NanResolution.SKIP and step.skip_step == 31
    assert ladder.skipped == [31] and ladder.last is None
    path = write_skips(tmp_path, ladder.skipped)
    assert json.loads(path.read_text())["steps"] == [31]
    assert skipped_steps(tmp_path) == frozenset({31})


def test_a_nan_that_moves_is_suspected_sdc():
    ladder = NanLadder()
    ladder.decide(_origin(31, 2), 0.0)
    step = ladder.decide(_origin(33, 1), 1.0)
    assert step.resolution is NanResolution.ROLLBACK and step.verdict == "sdc_suspected"


def test_the_ladder_round_trips_through_the_run_state():
    ladder = NanLadder(NanPolicy.SKIP, skipped=[3])
    ladder.decide(NanOrigin(7, (2,), ("n3",), {"epoch": 0, "index": 6}, "local loss"), 100.0)
    raw = json.loads(json.dumps(RunState(nan_ladder=ladder.to_state()).to_dict()))
    back = NanLadder.from_state(NanPolicy.SKIP, RunState.from_dict(raw).nan_ladder)
    assert back == ladder
    assert NanLadder.from_state(NanPolicy.STOP, None) == NanLadder(NanPolicy.STOP)


def test_a_ladder_record_that_does_not_fit_is_an_error_not_a_reset():
    for bad in ({"last": {"step": "7", "ranks": [], "nodes": []}},
                {"last": {"step": 7, "ranks": [1, 2], "nodes": ["n1"]}},
                {"last": None, "skipped": ["4"]}, {"last": [], "skipped": []},
                {"last": None, "last_at": "yesterday"}):
        with pytest.raises(ValueError, match="do(es)? not fit"):
            NanLadder.from_state(NanPolicy.STOP, bad)
