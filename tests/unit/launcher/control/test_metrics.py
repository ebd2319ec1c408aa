"""The controller's live metrics: exposition parsed back with prometheus_client's parsers."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from slurm_robust.launcher.control.live_ettr import LiveEttr
from slurm_robust.launcher.control.metrics import RunMetrics, label_value, sd_dir_from_env
from slurm_robust.launcher.messages import Incident


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def samples(metrics: RunMetrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: RunMetrics, name: str, **labels: str) -> float:
    labels = {"job_id": "42", "run_id": "r1", **labels}
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def incident(**kw) -> Incident:
    base = {"incident": "i1", "class": "worker_crash", "category": "explicit",
            "rung": "in_place", "fault_time": 100.0, "detected_at": 101.0,
            "localized_at": 101.5, "recovered_at": 105.0, "restored_step": 9,
            "restore_tier": "memory", "steps_lost": 1, "nodes": ["n1"], "evidence": {}}
    return Incident.from_json({**base, **kw})


def test_live_ettr_matches_the_definition_and_undoes_rolled_back_steps():
    e = LiveEttr(started_at=0.0, window_s=10.0)
    for step in range(1, 11):            # steps 1..10 finished at t = 1..10, 1 s each
        e.step(step, 1.0 if step > 1 else None, float(step))
    assert e.productive_s == pytest.approx(9.0)  # the first step has no time yet
    assert e.cumulative(10.0) == pytest.approx(0.9)
    e.rollback(7)                        # steps 8..10 are undone (redone later)
    assert e.productive_s == pytest.approx(6.0)
    e.step(8, None, 14.0)                # the first step after a restart: previous time
    assert e.productive_s == pytest.approx(7.0)
    assert e.cumulative(20.0) == pytest.approx(7.0 / 20.0)
    # window [10, 20]: only step 8's redo (finished at 14) is inside
    assert e.windowed(20.0) == pytest.approx(1.0 / 10.0)
    assert e.windowed(100.0) == 0.0


def test_live_ettr_is_clipped_to_one():
    e = LiveEttr(started_at=0.0)
    e.step(1, 5.0, 1.0)
    assert e.cumulative(1.0) == 1.0


def test_label_values_are_bounded():
    assert label_value("worker_crash") == "worker_crash"
    assert label_value("/home/u/secret path") == "other"
    assert label_value("x" * 80) == "other"
    assert label_value(None) == "none"


def test_steps_incidents_and_recovery_in_the_exposition():
    clock = Clock(0.0)
    m = RunMetrics("42", "r1", started_at=0.0, clock=clock)
    for step in range(1, 11):
        m.on_step(step, 0.5 if step > 1 else None, float(step))
    m.on_incident(incident())
    m.on_recovered(incident())
    m.on_incident(incident(incident="i2", **{"class": "hang"}, category="implicit",
                           rung="stop"))
    clock.t = 20.0
    assert value(m, "slurm_robust_run_steps_total") == 10
    assert value(m, "slurm_robust_run_last_step") == 10
    assert value(m, "slurm_robust_run_step_duration_seconds_count") == 9
    assert value(m, "slurm_robust_run_incidents_total", **{"class": "worker_crash"},
                 category="explicit", rung="in_place") == 1
    assert value(m, "slurm_robust_run_incidents_total", **{"class": "hang"},
                 category="implicit", rung="stop") == 1
    assert value(m, "slurm_robust_run_restarts_total", rung="in_place") == 1
    assert ("slurm_robust_run_restarts_total",) not in {(k[0],) for k in samples(m)
                                                        if ("rung", "stop") in k[1]}
    assert value(m, "slurm_robust_run_detect_seconds_sum") == pytest.approx(2.0)
    assert value(m, "slurm_robust_run_localize_seconds_sum") == pytest.approx(1.0)
    assert value(m, "slurm_robust_run_recover_seconds_sum") == pytest.approx(5.0)
    assert value(m, "slurm_robust_run_restores_total", tier="memory") == 1
    assert value(m, "slurm_robust_run_steps_lost_total") == 1
    # 9 steps of 0.5 s, step 10 rolled back (restored step 9): 4.0 s over 20 s of wall
    assert value(m, "slurm_robust_run_ettr_ratio", window="cumulative") == pytest.approx(0.2)
    assert value(m, "slurm_robust_run_ettr_ratio", window="1h") == pytest.approx(0.2)
    assert value(m, "slurm_robust_run_snapshot_age_seconds") == pytest.approx(10.0)


def test_phase_and_spares_are_read_at_scrape_time():
    m = RunMetrics("42", "r1", started_at=0.0, clock=Clock(1.0))
    state = {"phase": "gather", "spares": [3], "evicted": set()}
    m.watch(phase=lambda: state["phase"], spares_parked=lambda: len(state["spares"]),
            spares_used=lambda: len(state["evicted"]))
    assert value(m, "slurm_robust_run_phase", phase="gather") == 1
    state.update(phase="running", spares=[], evicted={3})
    assert value(m, "slurm_robust_run_phase", phase="gather") == 0
    assert value(m, "slurm_robust_run_phase", phase="running") == 1
    assert value(m, "slurm_robust_run_spares", state="parked") == 0
    assert value(m, "slurm_robust_run_spares", state="used") == 1


def test_openmetrics_exposition_parses_and_names_follow_conventions():
    m = RunMetrics("42", "r1", started_at=0.0, clock=Clock(5.0))
    m.on_step(1, 0.1, 1.0)
    m.on_incident(incident())
    text = generate_openmetrics(m.registry).decode()
    fams = {f.name: f for f in parse_om(text)}
    assert fams["slurm_robust_run_incidents"].type == "counter"
    assert fams["slurm_robust_run_step_duration_seconds"].type == "histogram"
    for fam in fams.values():
        assert fam.name.startswith("slurm_robust_")
        for s in fam.samples:
            assert s.labels["job_id"] == "42" and s.labels["run_id"] == "r1"
            assert not any("/" in v for v in s.labels.values())


def test_serve_binds_the_given_address_and_writes_the_targets(tmp_path):
    sd = tmp_path / "targets"
    sd.mkdir()
    m = RunMetrics("42", "r1")
    try:
        port = m.serve("127.0.0.1", tmp_path, 0, sd)
        where = json.loads((tmp_path / "metrics.json").read_text())
        assert (where["host"], where["port"], where["run_id"]) == ("127.0.0.1", port, "r1")
        target = json.loads((sd / "42-r1.json").read_text())
        assert target[0]["targets"] == [f"127.0.0.1:{port}"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        fams = {f.name for f in text_string_to_metric_families(body)}
        assert "slurm_robust_run_ettr_ratio" in fams
    finally:
        m.close()
    assert not (sd / "42-r1.json").exists()


def test_sd_dir_from_env(tmp_path):
    assert sd_dir_from_env({}) is None
    assert sd_dir_from_env({"SLURM_ROBUST_METRICS_SD_DIR": "/x"}).as_posix() == "/x"
    assert sd_dir_from_env({"SLURM_ROBUST_CLUSTER_DIR": str(tmp_path)}) is None
    (tmp_path / "prometheus" / "targets").mkdir(parents=True)
    assert sd_dir_from_env({"SLURM_ROBUST_CLUSTER_DIR": str(tmp_path)}) == \
        tmp_path / "prometheus" / "targets"


def test_snapshot_age_is_nan_before_any_step():
    m = RunMetrics("42", "r1", started_at=0.0, clock=Clock(1.0))
    assert math.isnan(value(m, "slurm_robust_run_snapshot_age_seconds"))
