"""ETTR: hand-computed runs, rollbacks, empty windows, and properties over synthetic runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_robust import records as rec
from slurm_robust.analysis import ettr
from slurm_robust.analysis.loaders import events_from_records, load_health, load_verdicts
from slurm_robust.analysis.pipeline import Inputs, analyse
from slurm_robust.analysis.slurm_text import parse_node_events
from slurm_robust.analysis.taxonomy import CLASSES, RUNGS
from slurm_robust_rehearsal.synth.runs import Fault, synth_run

T0 = 1_000_000.0


def ev(event: str, t: float, attempt: int = 0, run: str = "r", **fields):
    return rec.make_record(rec.EVENT_SCHEMA, rec.EVENT_VERSION,
                           {"run_id": run, "job_id": "7", "attempt": attempt, "event": event,
                            **fields}, now=t)


def step(t: float, s: int, attempt: int = 0, dt: float = 10.0, run: str = "r", rank=None):
    return ev("step", t, attempt, run, step=s, step_time_s=dt, loss=1.0, grad_norm=None,
              rank=rank)


def analysed(records, **kw):
    inputs = Inputs(log=events_from_records(records), verdicts=load_verdicts([]),
                    health=load_health([]), node_events=parse_node_events("").frame)
    return analyse(inputs, **kw)


def test_run_without_faults_loses_only_its_startup():
    # run_start at T0, attempt at T0+5, ten 10-s steps: wall 105 s, productive 100 s.
    records = [ev("run_start", T0, nodes=["n1"]), ev("attempt_start", T0 + 5, restored_step=None)]
    records += [step(T0 + 5 + 10 * k, k) for k in range(1, 11)]
    records.append(ev("run_end", T0 + 105, status="completed", step=10))
    an = analysed(records)
    row = an.per_run.iloc[0]
    assert row["wall_s"] == pytest.approx(105.0)
    assert row["productive_s"] == pytest.approx(100.0)
    assert row["ettr"] == pytest.approx(100 / 105)
    assert an.steps["kept"].all()


def test_rollback_makes_steps_after_the_restored_step_unproductive():
    # Steps 1-5 finish at T0+10..T0+50; fault; attempt 1 at T0+80 restores step 3, so steps
    # 4 and 5 of attempt 0 are redone (finished again at T0+90, T0+100) and then 6..10.
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 10 * k, k) for k in range(1, 6)]
    records.append(ev("attempt_start", T0 + 80, attempt=1, restored_step=3))
    records += [step(T0 + 80 + 10 * (k - 3), k, attempt=1) for k in range(4, 11)]
    records.append(ev("run_end", T0 + 150, attempt=1, status="completed", step=10))
    an = analysed(records)
    lost = an.steps[~an.steps["kept"]]
    assert sorted(zip(lost["attempt"], lost["step"], strict=True)) == [(0, 4), (0, 5)]
    row = an.per_run.iloc[0]
    assert row["productive_s"] == pytest.approx(100.0)  # ten distinct kept steps
    assert row["wall_s"] == pytest.approx(150.0)
    assert row["ettr"] == pytest.approx(100 / 150)


def test_incident_restored_step_alone_is_a_rollback():
    # No attempt_start for attempt 1: only the incident names the rollback.
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 10 * k, k) for k in range(1, 5)]
    records.append(ev("incident", T0 + 70, incident="i1", category="explicit",
                      **{"class": "worker_crash"}, fault_time=T0 + 41, detected_at=T0 + 45,
                      localized_at=T0 + 46, recovered_at=T0 + 70, rung="in_place",
                      nodes=[], ranks=[0], last_step=4, restored_step=2, steps_lost=2))
    records += [step(T0 + 60, 3, attempt=1), step(T0 + 70, 4, attempt=1)]
    an = analysed(records)
    assert (~an.steps["kept"]).sum() == 2
    assert an.per_run.iloc[0]["productive_s"] == pytest.approx(40.0)
    inc = an.incidents.iloc[0]
    assert inc["steps_redone"] == 2 and inc["lost_work_s"] == pytest.approx(20.0)
    assert inc["time_to_detect"] == pytest.approx(4.0)
    assert inc["time_to_localize"] == pytest.approx(1.0)
    assert inc["time_to_recover"] == pytest.approx(25.0)
    assert inc["lost_time_s"] == pytest.approx(29.0 + 20.0)


def test_restart_from_scratch_loses_every_earlier_step():
    records = [ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 10 * k, k) for k in range(1, 4)]
    records.append(ev("attempt_start", T0 + 40, attempt=1, restored_step=None))
    records += [step(T0 + 40 + 10 * k, k, attempt=1) for k in range(1, 4)]
    an = analysed(records)
    assert list(an.steps.loc[~an.steps["kept"], "attempt"]) == [0, 0, 0]
    assert an.per_run.iloc[0]["ettr"] == pytest.approx(30 / 70)


def test_window_with_no_work_has_ettr_zero():
    # One step, then the job waits 2 h in the queue (requeue), then one more step.
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None), step(T0 + 10, 1),
               ev("attempt_start", T0 + 10 + 7200, attempt=1, restored_step=1),
               step(T0 + 7220, 2, attempt=1)]
    an = analysed(records, window_s=600.0, every_s=600.0)
    sl = an.sliding
    inside_gap = sl[(sl["time"] > T0 + 1200) & (sl["time"] < T0 + 7200)]
    assert len(inside_gap) > 5
    assert (inside_gap["window_ettr"] == 0).all()
    first = sl.iloc[0]  # window [T0, T0+600]: 10 s of work
    assert first["window_ettr"] == pytest.approx(10 / 600)
    assert an.headline()["max_unproductive_s_in_window"] == pytest.approx(600.0)
    assert an.per_run.iloc[0]["ettr"] == pytest.approx(20 / 7220)


def test_min_window_ettr_counts_full_windows_only():
    # Steady 10-s steps after a 60-s start-up: every full 600-s window is productive, and
    # only the windows reaching back into the start-up hold less work.
    records = [ev("run_start", T0), ev("attempt_start", T0 + 60, restored_step=None)]
    records += [step(T0 + 60 + 10 * k, k) for k in range(1, 361)]
    records.append(ev("run_end", T0 + 3660, status="completed", step=360))
    an = analysed(records, window_s=600.0, every_s=60.0)
    assert an.sliding["window_ettr"].min() == pytest.approx(0.0)   # the start-up alone
    assert an.headline()["min_window_ettr"] == pytest.approx(540 / 600)
    short = analysed(records[:20], window_s=600.0)   # 18 steps: no full window
    assert short.headline()["min_window_ettr"] is None


def test_per_rank_records_reduce_to_the_slowest_rank():
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 10, 1, dt=8.0, rank=0), step(T0 + 10, 1, dt=10.0, rank=1)]
    records += [step(T0 + 20, 2, dt=10.0), step(T0 + 20, 2, dt=7.0, rank=0)]
    records.append(ev("run_end", T0 + 20, status="completed", step=2))
    an = analysed(records)
    assert len(an.steps) == 2
    assert an.per_run.iloc[0]["productive_s"] == pytest.approx(20.0)
    assert an.per_run.iloc[0]["ettr"] == pytest.approx(1.0)


def test_overlapping_duplicates_never_push_ettr_above_one():
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 5 * k, k, dt=10.0) for k in range(1, 11)]  # claims 2x the time
    an = analysed(records)
    assert an.per_run.iloc[0]["ettr"] == pytest.approx(1.0)
    assert an.sliding["window_ettr"].max() <= 1.0


def test_since_until_clip_the_wall_span():
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 10 * k, k) for k in range(1, 11)]
    an = analysed(records, since=T0 + 50, until=T0 + 80)
    row = an.per_run.iloc[0]
    assert row["wall_s"] == pytest.approx(30.0)
    assert row["productive_s"] == pytest.approx(30.0)


def test_synthetic_run_with_known_losses_matches_its_ground_truth():
    faults = [Fault(5, "cuda_error", "spare", restore_back=2, nodes=("n2",)),
              Fault(9, "hang", "in_place", localize_s=None, detect_s=60),
              Fault(12, "node_lost", "requeue", restart_s=300, restore_back=4)]
    run = synth_run(steps=20, step_time_s=10.0, faults=faults)
    an = analysed(run.events)
    row = an.per_run.iloc[0]
    assert row["wall_s"] == pytest.approx(run.truth.wall_s)
    assert row["productive_s"] == pytest.approx(run.truth.productive_s)
    assert row["ettr"] == pytest.approx(run.truth.ettr)
    assert int((~an.steps["kept"]).sum()) == run.truth.steps_redone == 6


fault_st = st.builds(
    lambda gap, cls, rung, back, det, loc, rst, into: (gap, Fault(
        0, cls, rung, into_step_s=into, detect_s=det, localize_s=loc, restart_s=rst,
        restore_back=back)),
    st.integers(1, 6), st.sampled_from(CLASSES), st.sampled_from(RUNGS), st.integers(0, 3),
    st.floats(0, 600), st.one_of(st.none(), st.floats(0, 120)), st.floats(0, 900),
    st.floats(0, 5))


@settings(max_examples=40, deadline=None)
@given(st.lists(fault_st, max_size=5), st.floats(0.5, 60), st.integers(10, 40))
def test_property_ettr_in_unit_interval_and_equal_to_truth(specs, dt, steps):
    faults, done = [], 0
    for gap, f in specs:
        at = done + gap
        if at > steps:
            break
        back = min(f.restore_back, at - 1)
        faults.append(Fault(at, f.cls, f.rung, f.into_step_s, f.detect_s, f.localize_s,
                            f.restart_s, back))
        if f.rung == "stop":
            break
        done = at - back
    run = synth_run(steps=steps, step_time_s=dt, faults=faults)
    an = analysed(run.events, window_s=600.0)
    value = an.per_run.iloc[0]["ettr"]
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(run.truth.ettr, rel=1e-6)
    win = an.sliding["window_ettr"].to_numpy()
    assert np.all((win >= 0) & (win <= 1))
    assert len(an.incidents) == len(faults)
    assert not math.isnan(an.headline()["ettr"])


def test_productive_before_matches_a_direct_sum():
    # Two runs with disjoint intervals; P(t) by brute force at many points.
    log = events_from_records(
        [step(T0 + 10 * k, k, run="a") for k in range(1, 6)]
        + [step(T0 + 7 * k, k, dt=3.0, run="b") for k in range(1, 6)])
    spans = ettr.run_spans(log)
    steps = ettr.cover_steps(ettr.dedup_steps(log.steps), log.attempts)
    steps["kept_steps"] = steps["covers"]
    iv, lost = ettr.productive_intervals(steps, spans)
    assert not lost.any()
    rng = np.random.default_rng(0)
    runs = rng.integers(0, 2, 200)
    times = T0 + rng.uniform(-5, 60, 200)
    got = ettr.productive_before(iv, runs, times)
    for r, t, g in zip(runs, times, got, strict=True):
        sel = iv[iv["run"] == r]
        want = np.clip(t - sel["a"].to_numpy(), 0, (sel["b"] - sel["a"]).to_numpy()).sum()
        assert g == pytest.approx(want)


@pytest.mark.parametrize("every", [2, 3, 7])
def test_sampled_step_records_stand_for_the_steps_between_them(every):
    faults = [Fault(7, "cuda_error", "spare", restore_back=3),
              Fault(15, "hang", "requeue", restore_back=5, restart_s=100.0)]
    run = synth_run(steps=24, step_time_s=10.0, faults=faults)
    # The last step before each fault is always written (the launcher forces it); steps
    # after the last written record would be invisible to any log reader.
    forced = {(0, 7), (1, 15)}
    sampled = [r for r in run.events if r["event"] != "step" or r["step"] % every == 0
               or r["step"] == 24 or (r["attempt"], r["step"]) in forced]
    an = analysed(sampled)
    assert an.per_run.iloc[0]["ettr"] == pytest.approx(run.truth.ettr)
    assert an.headline()["steps_redone"] == run.truth.steps_redone == 8
    assert an.incidents["steps_redone"].tolist() == [3, 5]
    assert an.incidents["lost_work_s"].tolist() == pytest.approx([30.0, 50.0])


def test_missing_step_time_counts_as_the_runs_median_step():
    # The launcher gives no step_time_s for an attempt's first step (it includes restart).
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 30, 1, dt=None)] + [step(T0 + 30 + 10 * k, k + 1) for k in range(1, 4)]
    an = analysed(records)
    assert an.issues.total == 0
    assert an.per_run.iloc[0]["productive_s"] == pytest.approx(40.0)
    assert an.per_run.iloc[0]["wall_s"] == pytest.approx(60.0)


def test_run_entirely_outside_the_period_has_no_wall_time():
    records = [ev("run_start", T0), ev("attempt_start", T0, restored_step=None)]
    records += [step(T0 + 10 * k, k) for k in range(1, 4)]
    an = analysed(records, since=T0 + 1000)
    assert an.per_run.iloc[0]["wall_s"] == 0.0
    assert an.headline()["ettr"] is None and an.sliding.empty


def test_short_runs_get_a_fine_sampling_grid():
    import pandas as pd

    from slurm_robust.analysis.ettr import default_every

    short = pd.DataFrame({"wall_s": [43.0, 20.0]})
    assert default_every(short, 3600.0) == 1.0          # 43 s / 200, at least 1 s
    medium = pd.DataFrame({"wall_s": [1200.0]})
    assert default_every(medium, 3600.0) == 6.0         # 1200 s / 200
    long = pd.DataFrame({"wall_s": [7200.0, 30.0]})
    assert default_every(long, 3600.0) == 300.0         # window / 12, as before


def test_grid_is_bounded_and_chunking_does_not_change_it(monkeypatch):
    import pandas as pd

    from slurm_robust_rehearsal.synth.fleet import synth_fleet

    spans = pd.DataFrame({"wall_s": [43.0] * 1000})
    # A fleet of short runs: the fine step grows until the fleet fits the budget.
    assert ettr.default_every(spans, 3600.0, max_points=4300) == 10.0
    assert ettr.default_every(spans.iloc[:1], 3600.0, max_points=4300) == 1.0
    inputs, _ = synth_fleet(300, seed=3)
    whole = analyse(inputs).sliding
    monkeypatch.setattr(ettr, "_GRID_CHUNK", 97)  # many chunks, boundaries mid-run
    chunked = analyse(inputs).sliding
    assert len(whole) > 10 * 97
    pd.testing.assert_frame_equal(whole, chunked)
    monkeypatch.setattr(ettr, "MAX_GRID_POINTS", 500)
    bounded = analyse(inputs).sliding
    assert len(bounded) <= 500 + 300  # the budget plus one end sample per run


def test_a_step_stamped_at_the_next_attempts_start_is_still_rolled_back():
    # Zero-length detection and restart: step 2 of attempt 0 and attempt 1's start share a
    # timestamp; step 2 is redone, so it is not productive (found by the property above).
    run = synth_run(steps=10, step_time_s=1.0, faults=[Fault(
        2, "cuda_error", "in_place", into_step_s=0.0, detect_s=0.0, localize_s=None,
        restart_s=0.0, restore_back=1)])
    an = analysed(run.events, window_s=600.0)
    assert an.per_run.iloc[0]["ettr"] == pytest.approx(run.truth.ettr)
    assert int((~an.steps["kept"]).sum()) == run.truth.steps_redone == 1
