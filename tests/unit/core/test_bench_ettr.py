"""bench ettr's pure parts: the fault schedule, the fault list and the downtime split."""

from __future__ import annotations

import os

import pytest

from slurm_robust.analysis.loaders import events_from_records, load_health, load_verdicts
from slurm_robust.analysis.pipeline import Inputs, analyse
from slurm_robust.analysis.slurm_text import parse_node_events
from slurm_robust.errors import UsageError
from slurm_robust_rehearsal.bench import ettr as bench_ettr
from slurm_robust_rehearsal.synth.runs import Fault, synth_run


def test_schedule_cycles_faults_and_leaves_time_to_recover():
    got = bench_ettr.schedule(100.0, minutes=4, every_s=60, faults=["nan", "kill-node"])
    # 240 s run: faults at 60, 120, 180 (not 240: no time left to recover).
    assert got == [(160.0, "nan"), (220.0, "kill-node"), (280.0, "nan")]
    assert bench_ettr.schedule(0.0, minutes=30, every_s=300, faults=["nan"])[-1][0] == 1500.0


def test_fault_list_is_checked():
    assert bench_ettr.parse_faults("kill-worker, nan") == ["kill-worker", "nan"]
    with pytest.raises(UsageError, match="slow-worker"):
        bench_ettr.parse_faults("nan,slow-worker")


def test_downtime_split_adds_up_per_phase():
    # Two in-place restarts: detect 5 s, localise 2 s, restart 10 s + one 10 s step,
    # the second also rolls back one step (10 s of redo).
    faults = [Fault(5, "cuda_error", "in_place", into_step_s=0.0, detect_s=5.0,
                    localize_s=2.0, restart_s=10.0, restore_back=0),
              Fault(12, "cuda_error", "in_place", into_step_s=0.0, detect_s=5.0,
                    localize_s=2.0, restart_s=10.0, restore_back=1)]
    run = synth_run(steps=20, step_time_s=10.0, faults=faults)
    an = analyse(Inputs(log=events_from_records(run.events), verdicts=load_verdicts([]),
                        health=load_health([]), node_events=parse_node_events("").frame))
    split = bench_ettr.downtime_split(an.incidents)
    assert split["detect_s"] == pytest.approx(10.0)
    assert split["localise_s"] == pytest.approx(4.0)
    assert split["redo_s"] == pytest.approx(10.0)
    assert split["recover_s"] > 2 * 10.0  # restart plus the first step after it


def test_torchrun_peer_figures_from_its_progress_lines(tmp_path):
    from slurm_robust_rehearsal.bench.ettr_torchrun import figures

    # 0.5 s steps from t=10; a kill at t=13.2 after step 7; DCP saved at step 5, so the
    # restarted workers redo 6 and 7 and the next step (6) ends at t=20.
    lines = [(s, 10 + 0.5 * s) for s in range(1, 8)]
    lines += [(s, 20 + 0.5 * (s - 6)) for s in range(6, 21)]
    injected = [{"at_s": 3.2, "fault": "kill-worker", "ok": True, "time": 13.7}]
    out = figures(lines, 20, started=8.0, ended_at=99.0, injected=injected, job="7",
                  run_dir=tmp_path)
    assert out["completed"] and out["steps_done"] == 20 and out["median_step_s"] == 0.5
    assert out["wall_s"] == 19.0  # job start (8) to the last step (27)
    assert out["ettr_cumulative"] == round(20 * 0.5 / 19.0, 4)
    assert out["faults"] == [{"at_s": 3.2, "fault": "kill-worker", "ok": True,
                              "fault_to_next_step_s": 6.3, "steps_redone": 2}]
    # Not finished by the cap: the wall time runs to the cap, and that is said.
    cut = figures(lines[:9], 20, started=8.0, ended_at=60.0, injected=[], job="7",
                  run_dir=tmp_path)
    assert cut["stopped_at_cap"] and cut["wall_s"] == 52.0 and cut["steps_done"] == 7


def test_torchrun_peer_fault_is_timed_to_the_restart_not_the_step_in_flight(tmp_path):
    from slurm_robust_rehearsal.bench.ettr_torchrun import figures

    # A NaN poison at t=11.7 lands after step 4 (t=12.0); step 5 fails, and the restarted
    # workers resume from step 2 (redoing 3 and 4) at t=17.
    lines = [(s, 10 + 0.5 * s) for s in range(1, 5)] + [(s, 17 + 0.5 * (s - 3))
                                                        for s in range(3, 9)]
    out = figures(lines, 8, started=9.0, ended_at=30.0, job="7", run_dir=tmp_path,
                  injected=[{"at_s": 1.7, "fault": "nan", "ok": True, "time": 11.7}])
    assert out["faults"][0]["fault_to_next_step_s"] == 5.3
    assert out["faults"][0]["steps_redone"] == 2
    stuck = figures(lines[:4], 8, started=9.0, ended_at=30.0, job="7", run_dir=tmp_path,
                    injected=[{"at_s": 1.7, "fault": "stop-worker", "ok": True,
                               "time": 11.7}])
    assert stuck["faults"][0]["fault_to_next_step_s"] is None


def test_torchrun_peer_fault_not_injected_has_no_figures(tmp_path):
    from slurm_robust_rehearsal.bench.ettr_torchrun import figures

    # kill-node at t=12 failed to inject; the only restart (t=20) is the kill-worker's
    # at t=13.7, which must not be counted twice.
    lines = [(s, 10 + 0.5 * s) for s in range(1, 8)]
    lines += [(s, 20 + 0.5 * (s - 6)) for s in range(6, 21)]
    injected = [{"at_s": 2.0, "fault": "kill-node", "ok": False, "time": 12.0,
                 "error": "no slurmd pid file"},
                {"at_s": 3.7, "fault": "kill-worker", "ok": True, "time": 13.7}]
    out = figures(lines, 20, started=8.0, ended_at=99.0, injected=injected, job="7",
                  run_dir=tmp_path)
    assert out["faults"][0] == {"at_s": 2.0, "fault": "kill-node", "ok": False,
                                "fault_to_next_step_s": None, "steps_redone": None}
    assert out["faults"][1]["fault_to_next_step_s"] == 6.3


def test_kill_node_takes_the_cluster_root_it_is_given(tmp_path, monkeypatch):
    from slurm_robust.launcher.errors import InjectionError
    from slurm_robust_rehearsal.inject.job import kill_node

    monkeypatch.delenv("SLURM_ROBUST_CLUSTER_DIR", raising=False)
    with pytest.raises(InjectionError, match="/nonexistent/run/mc-slurmd-node2.pid"):
        kill_node("7", "node2")
    # Given the root, it reads that cluster's pid file (here: not a slurmd).
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mc-slurmd-node2.pid").write_text(f"{os.getpid()}\n")
    with pytest.raises(InjectionError, match="is not a slurmd"):
        kill_node("7", "node2", str(tmp_path))


def test_sections_are_checked_and_their_time_shortens_the_run():
    assert bench_ettr.parse_sections(["eval:200:5", "save:500:3"]) == \
        ["eval:200:5", "save:500:3"]
    for bad in ("eval", "eval:0:5", "eval:two:5", ":200:5", "eval:200:5:1", "eval:200:x"):
        with pytest.raises(UsageError, match="NAME:EVERY:SECONDS"):
            bench_ettr.parse_sections([bad])
    assert bench_ettr.planned_steps(30, 0.5, []) == 3600
    # 5 s every 200 steps and 3 s every 500 add 0.031 s a step on average.
    assert bench_ettr.planned_steps(30, 0.5, ["eval:200:5", "save:500:3"]) == 3390
    assert bench_ettr.section_args(["eval:200:5"]) == ["--section", "eval:200:5"]


def test_phase_figures_name_each_hang_limit(tmp_path):
    import pandas as pd

    from slurm_robust.launcher.control.state import RunState, save_state

    state = RunState()
    state.declares_phases = True
    state.hang_limits = {"steps": 3.0, "eval": 30.0}
    save_state(tmp_path / "state.json", state)
    incidents = pd.DataFrame([
        {"class": "job_hang", "time_to_detect": 3.4,
         "evidence": {"hang_limit": {"phase": "steps", "limit_s": 3.0}}},
        {"class": "node_lost", "time_to_detect": 4.0, "evidence": {}}])
    got = bench_ettr.phase_figures(tmp_path, incidents)
    assert got == {"declared": True, "limits_s": {"steps": 3.0, "eval": 30.0},
                   "hangs": [{"hang_limit": {"phase": "steps", "limit_s": 3.0},
                              "time_to_detect_s": 3.4}]}
    plain = bench_ettr.phase_figures(tmp_path / "none", incidents.iloc[1:])
    assert plain == {"declared": False, "limits_s": {}, "hangs": []}


def test_torchrun_peer_counts_section_time_as_productive(tmp_path):
    from slurm_robust_rehearsal.bench.ettr_torchrun import figures

    per_step = bench_ettr.section_s_per_step(["eval:200:5", "save:500:3"])
    assert per_step == pytest.approx(5 / 200 + 3 / 500)
    lines = [(s, 10 + 0.5 * s) for s in range(1, 21)]
    out = figures(lines, 20, started=10.0, ended_at=99.0, injected=[], job="7",
                  run_dir=tmp_path, section_s=per_step)
    assert out["ettr_cumulative"] == round(20 * (0.5 + per_step) / 10.0, 4)
