"""The recovery owner with the NaN ladder: scripted anomaly lines and exits (fake clock,
real event log). The first reporter is an innocent rank; the incident must name the
origin, blame no node, and stop or skip per policy when the NaN returns on replay."""

from __future__ import annotations

import json

from slurm_robust.launcher.control.nan_ladder import NAN_SETTLE_S
from slurm_robust.launcher.enums import Phase, Role
from slurm_robust.launcher.node.nan_local import SKIP_FILE, nan_dir
from tests.unit.launcher.control.test_recovery_owner import Harness


def _nan(h: Harness, member, step: int, local: bool | None, pos: int | None = None,
         exit_too: bool = True) -> None:
    rank = h.rec.ranks_of(member.index)[0]
    line = {"kind": "anomaly", "rank": rank, "step": step, "what": "nan",
            "name": "grad_norm", "value": "nan"}
    if local is not None:
        line.update(local=local, local_name="loss" if local else None, data_position=pos)
    exits = [{"rank": rank, "gen": h.gen(), "exit_code": 87, "signal": None,
              "time": h.clock(), "class": "nan", "category": "implicit",
              "secondary": False, "signature": "nan", "line": "nan", "evidence": {},
              "log": None}] if exit_too else []
    h.report(member, [line], exits)


def _three(tmp_path, **kw) -> Harness:
    h = Harness(tmp_path, nodes=3, spares=1, **kw)
    h.start()
    return h


def test_incident_names_the_origin_not_the_first_reporter(tmp_path):
    h = _three(tmp_path)
    n1, n2, n3 = h.slot_members()
    _nan(h, n1, 4, False)  # rank 0 reports first: NaN arrived through the all-reduce
    h.tick(0.4)            # past SETTLE_S, but rank 2's line is not in yet: wait
    assert h.gen() == 1
    _nan(h, n2, 4, False)
    _nan(h, n3, 4, True, 3)
    h.tick(0.05)
    assert h.gen() == 2 and h.rec.phase is Phase.RUNNING
    inc = h.rec.state.open_incident.to_json()
    assert inc["nodes"] == ["n3"] and inc["ranks"] == [2]
    nan = inc["evidence"]["nan"]
    assert nan["origin"] == "n3 rank 2" and nan["resolution"] == "reattempt"
    assert nan["first_reporter"] == {"rank": 0, "node": "n1"}
    assert h.rec.state.node_failures == {} and h.slurm.calls == []


def test_unknown_origin_blames_no_node_after_the_settle_time(tmp_path):
    h = _three(tmp_path)
    n1 = h.slot_members()[0]
    _nan(h, n1, 4, None)
    h.tick(NAN_SETTLE_S + 0.1)
    inc = h.rec.state.open_incident.to_json()
    assert inc["nodes"] == [] and inc["ranks"] == []
    assert inc["evidence"]["nan"]["origin"] == "origin unknown"


def _nan_everywhere(h: Harness, step: int) -> None:
    n1, n2, n3 = h.slot_members()
    _nan(h, n1, step, False)
    _nan(h, n2, step, False)
    _nan(h, n3, step, True, step - 1)
    h.tick(0.4)


def test_data_nan_stops_after_one_replay_and_evicts_nothing(tmp_path):
    h = _three(tmp_path)
    _nan_everywhere(h, 4)
    h.restored(3)
    _nan_everywhere(h, 4)  # the replay hits it again at the same step and origin
    assert h.rec.phase is Phase.DONE and h.rec.result.status == "stopped"
    verdict = h.rec.result.verdict
    assert "step 4" in verdict and "data position 3" in verdict and "n3 rank 2" in verdict
    assert not any(c[0] in ("verdict", "drain") for c in h.slurm.calls)
    inc = h.incidents()[-1]
    assert inc["rung"] == "stop" and inc["evidence"]["nan"]["verdict"] == "data_or_model"
    assert all(h.rec.plan_for(i).role is Role.EXIT for i in h.members)


def test_data_nan_is_skipped_under_the_skip_policy(tmp_path):
    h = _three(tmp_path, nan_policy="skip")
    _nan_everywhere(h, 4)
    h.restored(3)
    _nan_everywhere(h, 4)
    assert h.rec.phase is Phase.RUNNING and h.gen() == 3
    assert h.rec.state.open_incident.to_json()["evidence"]["nan"]["resolution"] == "skip"
    assert json.loads((nan_dir(h.cfg.run_dir) / SKIP_FILE).read_text())["steps"] == [4]
    assert h.rec.gen.slots == [0, 1, 2]  # same nodes: nobody evicted


def test_a_requeue_between_the_nan_and_its_replay_keeps_the_ladder(tmp_path):
    h = _three(tmp_path)
    _nan_everywhere(h, 4)
    assert h.rec.state.open_incident.to_json()["evidence"]["nan"]["resolution"] == "reattempt"
    h.rec.persist()  # e.g. a node lost before the replay: the job is requeued
    h2 = _three(tmp_path)  # the next allocation's controller, on the same run dir
    h2.restored(3)
    _nan_everywhere(h2, 4)  # the replay on the new allocation: the same place again
    assert h2.rec.phase is Phase.DONE and h2.rec.result.status == "stopped"
    assert h2.incidents()[-1]["evidence"]["nan"]["verdict"] == "data_or_model"


def test_batches_skipped_before_a_requeue_stay_skipped(tmp_path):
    h = _three(tmp_path, nan_policy="skip")
    _nan_everywhere(h, 4)
    h.restored(3)
    _nan_everywhere(h, 4)  # skipped
    h.rec.persist()
    h2 = _three(tmp_path, nan_policy="skip")  # the next allocation's controller
    _nan_everywhere(h2, 9)
    h2.restored(8)
    _nan_everywhere(h2, 9)
    skip = json.loads((nan_dir(h2.cfg.run_dir) / SKIP_FILE).read_text())
    assert skip["steps"] == [4, 9]
