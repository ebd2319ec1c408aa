"""Run state persistence and the launcher's config and event records."""

from __future__ import annotations

import json

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig, env_defaults
from slurm_robust.launcher.control import accounting
from slurm_robust.launcher.control.events import (
    INCIDENT_FIELDS,
    EventLog,
    last_logged_step,
    make_incident,
    new_incident,
)
from slurm_robust.launcher.control.state import RunState, load_state, save_state
from slurm_robust.launcher.enums import Rung
from slurm_robust.launcher.submit.options import parse_time_minutes
from slurm_robust.records import read_records


def test_state_round_trips_and_missing_file_is_fresh(tmp_path):
    path = tmp_path / "state.json"
    fresh = load_state(path)
    assert fresh.attempt == -1 and fresh.restarts == 0
    first = new_incident("i1", "worker_signal", "explicit", 90.0, nodes=["node2"])
    first.rung = Rung.IN_PLACE
    open_inc = new_incident("i2", "node_lost", "explicit", 99.0, fault_time=98.5,
                            nodes=["node1"], ranks=[0], last_step=7,
                            evidence={"heartbeat_age_s": 3.2})
    accounting.cut_short(first, open_inc, 99.0)
    st = RunState(attempt=3, restarts=2, signatures={"TypeError@t.py:1": 1},
                  slots=["node1", "node2"], open_incident=open_inc)
    save_state(path, st)
    back = load_state(path)
    assert back == st
    # On disk the open incident is its event record plus the incidents it cut short.
    raw = json.loads(path.read_text())["open_incident"]
    assert set(raw) == {*INCIDENT_FIELDS, "_cut_short"}
    assert raw["class"] == "node_lost" and raw["_cut_short"][0]["incident"] == "i1"
    assert "_cut_short" not in raw["_cut_short"][0]


def test_corrupt_state_is_an_error_not_a_silent_reset(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="state.json"):
        load_state(path)


def test_config_rejects_bad_values_and_unknown_keys(tmp_path):
    with pytest.raises(UsageError, match="no worker command"):
        RunConfig(command=(), run_dir=str(tmp_path))
    with pytest.raises(UsageError, match="heartbeat"):
        RunConfig(command=("x",), run_dir=str(tmp_path), heartbeat_s=5, heartbeat_timeout_s=1)
    cfg = RunConfig(command=("python", "t.py"), run_dir=str(tmp_path), nodes=4, spares=1)
    assert cfg.total_nodes == 5 and RunConfig.from_dict(json.loads(json.dumps(
        cfg.to_dict()))) == cfg
    with pytest.raises(UsageError, match="unknown key"):
        RunConfig.from_dict({**cfg.to_dict(), "spars": 1})


def test_env_defaults_for_launch():
    assert env_defaults({"SLURM_ROBUST_SPARES": "2", "SLURM_ROBUST_HANG_TIMEOUT": "90"}) == \
        {"spares": 2, "hang_floor_s": 90.0}
    assert env_defaults({"SLURM_ROBUST_CKPT_EVERY": "50"}) == {"local_every": 50}
    for bad in ("two", "-1", "01", " 1", "1s", ""):
        with pytest.raises(UsageError, match="SLURM_ROBUST_SPARES"):
            env_defaults({"SLURM_ROBUST_SPARES": bad})


def test_time_parsing():
    assert parse_time_minutes("90") == 90
    assert parse_time_minutes("01:30:01") == 91
    assert parse_time_minutes("1-00:00") == 1440
    with pytest.raises(UsageError):
        parse_time_minutes("soon")


def test_event_log_writes_documented_records(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", "r1", "42", attempt=1, max_per_s=2)
    log.run_start(["n1"], ["n2"], 1, {"tp": 1, "pp": 1, "dp": 1}, {})
    assert log.step(1, 0.1, 2.5, None, now=100.0)
    assert not log.step(2, 0.1, 2.4, None, now=100.1)      # sampled out
    assert log.step(3, 0.1, float("nan"), None, force=True, now=100.2)
    inc = make_incident("i1", "worker_crash", "explicit", 99.0, nodes=["n1"])
    inc.update(rung="in_place")
    log.incident(inc)
    log.run_end("completed", 3, "ab" * 32, None)
    recs = read_records(tmp_path / "events.jsonl").records
    assert [r["event"] for r in recs] == ["run_start", "step", "step", "incident", "run_end"]
    assert all(r["schema"] == "slurm_robust.event" and r["v"] == 1 and r["attempt"] == 1
               and r["run_id"] == "r1" and r["job_id"] == "42" for r in recs)
    assert recs[2]["loss"] is None
    assert list(recs[3])[-len(INCIDENT_FIELDS):] == list(INCIDENT_FIELDS)
    with pytest.raises(ValueError, match="lacks"):
        log.incident({"incident": "i2"})


def test_last_logged_step_reads_the_tail(tmp_path):
    path = tmp_path / "events.jsonl"
    assert last_logged_step(path) is None
    log = EventLog(path, "r", "1", max_per_s=0)
    for step in range(1, 2001):
        log.step(step, 0.1, 1.0, None)
    log.run_end("completed", 2000, None, None)
    with open(path, "ab") as fh:
        fh.write(b'{"torn')
    assert last_logged_step(path) == 2000
