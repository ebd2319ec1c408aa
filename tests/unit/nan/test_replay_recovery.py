"""Dual-phase replay in the recovery owner (fake clock, real event log, scripted agents):
a NaN that moves twice starts the replay; the replay generations give each group a world
of its own; the failing row and column locate the node, which goes to the spare; an
inconclusive replay rolls back in place."""

from __future__ import annotations

from slurm_robust.launcher.control import replay
from slurm_robust.launcher.enums import Phase, Role
from tests.unit.launcher.control.test_recovery_owner import Harness
from tests.unit.nan.test_nan_recovery import _nan


def _four(tmp_path, **kw) -> Harness:
    h = Harness(tmp_path, nodes=4, spares=1, **kw)
    h.start()  # steps 1..3
    return h


def _nan_from(h: Harness, origin: int, step: int) -> None:
    """Every slot's ranks report a NaN at ``step``; the slot ``origin`` had it locally."""
    for pos, m in enumerate(h.slot_members()):
        _nan(h, m, step, pos == origin, step - 1)
    h.tick(0.4)


def _to_replay(h: Harness, origin: int = 2) -> None:
    _nan_from(h, origin, 5)      # reattempt
    h.restored(3)
    _nan_from(h, origin, 4)      # moved: rollback
    h.restored(3)
    _nan_from(h, origin, 6)      # moved again: dual-phase replay
    assert h.rec.phase is Phase.REPLAYING


def _replay_env(h: Harness, index: int) -> replay.ReplaySpec:
    plan = h.rec.plan_for(index)
    assert plan is not None and plan.env is not None
    return replay.ReplaySpec.from_env(plan.env[replay.REPLAY_ENV])


def _group_ends(h: Harness, slots: list[int], nan: bool) -> None:
    """The agents of ``slots`` report their replay's end: a NaN, or exit 0."""
    for pos in slots:
        m = h.slot_members()[pos]
        exits = [{"rank": 0, "gen": h.gen(), "exit_code": 87 if nan else 0, "signal": None,
                  "time": h.clock(), "class": "nan" if nan else "ok",
                  "category": "implicit", "secondary": False, "signature": None,
                  "line": None, "evidence": {}, "log": None}]
        h.report(m, [], exits)
    h.tick(0.05)


def test_a_nan_that_moves_twice_is_replayed_by_rows_then_columns(tmp_path):
    h = _four(tmp_path)
    _to_replay(h)
    # Horizontal: rows {0,1} and {2,3}, each a world of 2 with its own master and port.
    p0, p1, p2 = (h.rec.plan_for(i) for i in (0, 1, 2))
    assert (p0.world_size, p0.slot, p0.ranks) == (2, 0, [0])
    assert (p1.world_size, p1.slot, p1.ranks) == (2, 1, [0 + 1])
    assert (p2.world_size, p2.slot) == (2, 0) and p2.master_port != p0.master_port
    assert p0.master_addr == h.members[0].addr and p2.master_addr == h.members[2].addr
    spec = _replay_env(h, 2)
    assert (spec.phase, spec.group, spec.global_ranks, spec.global_world) == \
        ("horizontal", 1, (2,), 4)
    # From the step before the NaN (every rank snapshotted it), past the NaN steps seen.
    assert spec.restore_step == 5 and spec.until_step == 6 + replay.EXTRA_STEPS
    assert h.rec.state.last_step == 3  # the replay's steps are not the run's
    _group_ends(h, [0, 1], nan=False)
    _group_ends(h, [2, 3], nan=True)
    # Vertical: columns {0,2} and {1,3}.
    assert h.rec.phase is Phase.REPLAYING
    assert _replay_env(h, 2).phase == "vertical" and h.rec.plan_for(2).slot == 1
    _group_ends(h, [1, 3], nan=False)
    _group_ends(h, [0, 2], nan=True)
    h.wait_slurm()
    # Row 1 x column 0 = slot 2 (n3): evicted to the spare n5, restored in place.
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 1, 4, 3]
    assert h.rec.plan_for(2).role is Role.EVICTED
    assert replay.REPLAY_ENV not in (h.rec.plan_for(0).env or {})
    inc = h.rec.state.open_incident.to_json()
    rp = inc["evidence"]["nan"]["replay"]
    assert inc["evidence"]["nan"]["resolution"] == "replay" and inc["rung"] == "spare"
    assert rp["located"] == "n3" and rp["grid"] == [2, 2]
    assert rp["groups"] == {"horizontal": {0: "passed", 1: "nan"},
                            "vertical": {0: "nan", 1: "passed"}}
    assert ("verdict", "n3", "nan") in h.slurm.calls
    assert h.rec.nan.last is None and h.rec.nan.moves == 0  # a new episode from here


def test_an_inconclusive_replay_rolls_back_in_place(tmp_path):
    h = _four(tmp_path)
    _to_replay(h)
    _group_ends(h, [0, 1, 2, 3], nan=False)  # the corruption did not show
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 1, 2, 3]
    inc = h.rec.state.open_incident.to_json()
    assert inc["rung"] == "in_place"
    assert inc["evidence"]["nan"]["resolution"] == "rollback"
    assert "0 horizontal group(s) reproduced" in inc["evidence"]["nan"]["replay"]["reason"]
    assert not any(c[0] == "verdict" for c in h.slurm.calls)


def test_an_agent_lost_during_the_replay_goes_to_the_ladder(tmp_path):
    h = _four(tmp_path)
    _to_replay(h)
    lost = h.slot_members()[1]
    h.rec.on_agent_lost(lost, True, h.clock())
    h.tick(0.05)
    h.settle()
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 4, 2, 3]
    assert h.rec.state.open_incident.to_json()["class"] == "node_lost"
    h.restored(3)
    h.steps(1)  # the spare's generation recovers: both incidents are written
    by_id = {i["incident"]: i for i in h.incidents()}
    nan = by_id["i3"]["evidence"]["nan"]
    assert nan["resolution"] == "rollback" and "agent was lost" in nan["replay"]["reason"]
    assert by_id["i4"]["class"] == "node_lost" and by_id["i4"]["rung"] == "spare"


def test_grid_follows_algorithm_1():
    g = replay.Grid.of(24)
    assert (g.m, g.n) == (4, 6)  # the paper's Fig. 6
    assert g.locate([2], [1]) == 13  # machine #13 of its figure
    assert replay.Grid.of(3).groups(replay.ReplayPhase.VERTICAL) == [[0], [1], [2]]
    assert g.locate([0, 1], [1]) is None


def _group_crashes(h: Harness, slots: list[int]) -> None:
    """The agents of ``slots`` report a worker that died of something else than a NaN."""
    for pos in slots:
        m = h.slot_members()[pos]
        exits = [{"rank": 0, "gen": h.gen(), "exit_code": 1, "signal": None,
                  "time": h.clock(), "class": "network", "category": "explicit",
                  "secondary": False, "signature": None,
                  "line": "Connection closed by peer", "evidence": {}, "log": None}]
        h.report(m, [], exits)
    h.tick(0.05)


def test_a_phase_whose_group_crashed_runs_once_more(tmp_path):
    h = _four(tmp_path)
    _to_replay(h)
    first = h.rec.gen.attempt
    _group_ends(h, [0, 1], nan=False)
    _group_crashes(h, [2, 3])  # no answer from row 1: the phase again, fresh attempts
    assert h.rec.phase is Phase.REPLAYING and h.rec.gen.attempt > first
    assert _replay_env(h, 2).phase == "horizontal"
    _group_ends(h, [0, 1], nan=False)
    _group_ends(h, [2, 3], nan=True)
    assert _replay_env(h, 2).phase == "vertical"
    _group_ends(h, [1, 3], nan=False)
    _group_ends(h, [0, 2], nan=True)
    h.wait_slurm()
    rp = h.rec.state.open_incident.to_json()["evidence"]["nan"]["replay"]
    assert rp["located"] == "n3" and rp["retried"] == ["horizontal"]
    assert any("Connection closed by peer" in e for e in rp["errors"]), rp


def test_a_group_that_crashes_twice_ends_the_replay_inconclusive(tmp_path):
    h = _four(tmp_path)
    _to_replay(h)
    for _ in range(2):
        _group_ends(h, [0, 1], nan=False)
        _group_crashes(h, [2, 3])
    assert h.rec.phase is Phase.RUNNING
    nan = h.rec.state.open_incident.to_json()["evidence"]["nan"]
    assert nan["resolution"] == "rollback" and nan["replay"]["retried"] == ["horizontal"]
    assert "ended without an answer (error)" in nan["replay"]["reason"]
