"""Loaders: explicit dtypes, and bad lines or records counted, never dropped silently."""

from __future__ import annotations

from pathlib import Path

from slurm_robust import records as rec
from slurm_robust.analysis.loaders import (
    load_health,
    load_run_dirs,
    load_verdicts,
)
from slurm_robust_rehearsal.synth.runs import Fault, synth_run, write_run_dir


def _health(node: str, status: str, run_id: str, t: float) -> dict:
    return rec.make_record(rec.HEALTH_SCHEMA, rec.HEALTH_VERSION, {
        "node": node, "job": "5", "stage": "prolog", "run_id": run_id, "check": "gpu_xid",
        "status": status, "duration_s": 0.01, "reason": "", "evidence": {},
        "injected": False}, now=t)


def test_run_dir_loads_with_explicit_dtypes(tmp_path: Path):
    run = synth_run(steps=6, faults=[Fault(3, "oom", "spare", nodes=("n1",))])
    write_run_dir(tmp_path / "r", run)
    log = load_run_dirs([tmp_path / "r"])
    assert log.issues.total == 0
    assert str(log.steps["run_id"].dtype) == "category"
    assert str(log.steps["step"].dtype) == "int64"
    assert str(log.steps["time"].dtype) == "float64"
    assert str(log.steps["rank"].dtype) == "Int64"
    assert str(log.incidents["class"].dtype) == "category"
    assert "job_hang" in log.incidents["class"].cat.categories  # the whole taxonomy
    assert list(log.incidents["nodes"]) == [["n1"]]
    assert len(log.steps) == 6 and len(log.attempts) == 2 and len(log.ends) == 1


def test_malformed_lines_invalid_records_and_unknown_events_are_counted(tmp_path: Path):
    run = synth_run(steps=4)
    d = write_run_dir(tmp_path / "r", run)
    bad_step = dict(run.events[3], step="three")        # wrong type
    no_time = {k: v for k, v in run.events[4].items() if k != "time"}  # missing field
    future = dict(run.events[2], event="checkpoint_saved")  # a newer writer
    rec.append_records(d / "events.jsonl", [bad_step, no_time, future])
    with open(d / "events.jsonl", "a") as fh:
        fh.write("{not json\n")
        fh.write('{"torn": tr')
    log = load_run_dirs([d, tmp_path / "missing"])
    issues = log.issues.as_dict()
    assert issues["malformed_lines"] == {str(d / "events.jsonl"): 2}
    assert issues["invalid_records"][f"{d / 'events.jsonl'}: step"] == 2
    assert issues["invalid_records"][f"{tmp_path / 'missing' / 'events.jsonl'}: missing"] == 1
    assert issues["unknown_events"] == {f"{d / 'events.jsonl'}: checkpoint_saved": 1}
    assert issues["total"] == 5
    assert issues["examples"]
    assert len(log.steps) == 4  # the good records all survive


def test_runs_from_several_dirs_share_run_id_categories(tmp_path: Path):
    for name in ("a", "b"):
        write_run_dir(tmp_path / name, synth_run(run_id=name, steps=3))
    log = load_run_dirs([tmp_path / "a", tmp_path / "b"])
    cats = list(log.steps["run_id"].cat.categories)
    assert cats == ["a", "b"]
    for frame in (log.runs, log.attempts, log.incidents, log.ends):
        assert list(frame["run_id"].cat.categories) == cats


def test_health_journals_from_a_directory_and_verdicts(tmp_path: Path):
    jdir = tmp_path / "nodes"
    rec.append_records(jdir / "n1" / "health" / "n1.jsonl",
                       [_health("n1", "ok", "a", 1.0), _health("n1", "fail", "b", 2.0)])
    rec.append_records(jdir / "n2" / "health" / "n2.jsonl", [_health("n2", "maybe", "c", 3.0)])
    with open(jdir / "n2" / "health" / "n2.jsonl", "a") as fh:
        fh.write("garbage\n")
    from slurm_robust.analysis.frames import LoadIssues
    issues = LoadIssues()
    health = load_health([jdir], issues)
    assert len(health) == 3
    assert list(health["status"].cat.categories)[:4] == ["ok", "warn", "fail", "skip"]
    assert "maybe" in set(health["status"].astype(str))  # unknown status kept, not NaN
    assert sum(issues.malformed_lines.values()) == 1
    run = synth_run(steps=6, faults=[Fault(3, "oom", "spare", nodes=("n1", "n2"))])
    write_run_dir(tmp_path / "r", run)
    verdicts = load_verdicts([tmp_path / "r"], issues)
    assert list(verdicts["node"].astype(str)) == ["n1", "n2"]
    assert set(verdicts["class"].astype(str)) == {"gpu_oom"}  # legacy "oom"


def test_non_finite_losses_spelled_as_strings_are_read_as_floats(tmp_path: Path):
    run = synth_run(steps=3)
    run.events[2]["loss"] = "nan"
    run.events[3]["grad_norm"] = "inf"
    log = load_run_dirs([write_run_dir(tmp_path / "r", run)])
    assert log.issues.total == 0
    assert log.steps["loss"].isna().sum() == 1
    assert log.steps["grad_norm"].max() == float("inf")
