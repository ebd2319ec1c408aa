"""Failure-mix and recovery-time files, the paper defaults, measured times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.control.events import EventLog, make_incident
from slurm_robust.simulate import paper
from slurm_robust.simulate.config import (
    byterobust_mix,
    byterobust_times,
    evicting_share,
    load_mix,
    times_from_json,
)
from slurm_robust.simulate.dists import parse
from slurm_robust.simulate.engine import auto_spares, machine_fail_prob
from slurm_robust.simulate.measured import measured_times


def test_byterobust_mix_is_table1_at_the_table5_rate() -> None:
    mix = byterobust_mix()
    assert sum(c.share for c in mix.classes) == pytest.approx(100.0)
    assert evicting_share(mix) == pytest.approx(42.8)
    assert machine_fail_prob(mix) == pytest.approx(paper.MACHINE_FAIL_PER_DAY)


def test_reserve_sizing_reproduces_table5() -> None:
    mix = byterobust_mix()
    assert {n: auto_spares(n, mix) for n in paper.TABLE5_SPARES} == paper.TABLE5_SPARES


def test_table7_is_interpolated_in_log2_machines() -> None:
    assert paper.table7(1024, paper.TABLE7_REQUEUE_S) == pytest.approx(768.0)
    assert paper.table7(128, paper.TABLE7_HOT_UPDATE_S) == pytest.approx(46.0)
    assert 768.0 < paper.table7(1200, paper.TABLE7_REQUEUE_S) < 800.0
    t = byterobust_times(1024)
    assert (t.restart.mean, t.requeue.mean) == (65.0, 768.0)


def test_mix_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps(byterobust_mix().to_json()))
    again = load_mix(str(path))
    assert again.classes == byterobust_mix().classes
    assert again.switch_prob == paper.SWITCH_FAILURE_PROB


def test_mix_file_with_unknown_class_names_the_taxonomy(tmp_path: Path) -> None:
    path = tmp_path / "mix.json"
    path.write_text(json.dumps({"rate_per_machine_day": 0.01,
                                "classes": [{"class": "cosmic_ray", "share": 1}]}))
    with pytest.raises(UsageError, match="cosmic_ray.*taxonomy"):
        load_mix(str(path))


def test_recovery_times_file_rejects_unknown_fields() -> None:
    base = byterobust_times(128)
    t = times_from_json({"requeue": {"dist": "uniform", "lo": 100, "hi": 200}, "step": 5},
                        base, "f.json")
    assert (t.requeue.mean, t.step, t.restart) == (150.0, 5.0, base.restart)
    with pytest.raises(UsageError, match="unknown field"):
        times_from_json({"requeu": 1}, base, "f.json")


def test_bad_distributions_are_refused() -> None:
    with pytest.raises(UsageError):
        parse({"dist": "uniform", "lo": 5, "hi": 1}, "x")
    with pytest.raises(UsageError):
        parse({"dist": "gamma"}, "x")
    assert parse(12, "x").mean == 12.0
    assert parse({"dist": "exp", "mean": 10, "max": 10}, "x").mean < 10.0


def test_measured_times_come_from_rehearsal_event_logs(tmp_path: Path) -> None:
    # Written with the launcher's own EventLog, as a rehearsal run would.
    log = EventLog(tmp_path / "r1" / "events.jsonl", "r1", "7")
    (tmp_path / "r1").mkdir()
    for i, (rung, took) in enumerate([("in_place", 12.0), ("in_place", 18.0),
                                      ("spare", 30.0)]):
        inc = make_incident(f"i{i}", "worker_signal", "explicit", 100.0, fault_time=99.0)
        inc.update(localized_at=101.0, recovered_at=101.0 + took, rung=rung)
        log.incident(inc)
    t = measured_times(str(tmp_path), byterobust_times(128))
    assert t.restart.values == (12.0, 18.0) and t.spare.values == (30.0,)
    assert t.requeue == byterobust_times(128).requeue  # not measured: the paper's
    assert "in_place: 2" in t.source


def test_measured_times_without_runs_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="rehearsal"):
        measured_times(str(tmp_path), byterobust_times(128))
