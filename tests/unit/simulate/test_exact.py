"""Exact small cases: known faults and times give a known ETTR and downtime split."""

from __future__ import annotations

import pytest

from slurm_robust.simulate.engine import simulate
from slurm_robust.simulate.job import UNLIMITED

from .helpers import GPU, config, incident

DAY = 86400.0


def test_no_fault_is_all_productive() -> None:
    s = simulate(config([], spares=0)).summary
    assert s["ettr"] == 1.0
    assert s["incidents"] == 0
    assert s["sliding_ettr_min"] == 1.0


def test_one_fault_in_place_exact_ettr_and_split() -> None:
    # Fault at 1000.5 s of training: 100 steps done, 0.5 s of the 101st lost; then 30 s
    # detection, 20 s localisation, 60 s restart; training resumes at 1110.5 s and
    # finishes floor((86400 - 1110.5) / 10) = 8528 more steps.
    s = simulate(config([incident(1000.5)], spares=0)).summary
    assert s["by_rung"]["in_place"] == 1
    assert s["downtime_s"] == {"detection": 30.0, "localisation": 20.0, "failover": 60.0,
                               "recompute": 0.5}
    assert s["productive_s"] == pytest.approx((100 + 8528) * 10.0)
    assert s["ettr"] == pytest.approx(86280.0 / DAY, abs=1e-12)


def test_node_fault_uses_a_spare_then_requeues_when_none_is_left() -> None:
    trace = [incident(1000.0, GPU, slot=2, index=0), incident(5000.0, GPU, slot=4, index=1)]
    result = simulate(config(trace, spares=1))
    s = result.summary
    assert s["by_rung"] == {"in_place": 0, "spare": 1, "requeue": 1, "stop": 0}
    spare, requeue = result.job.incidents
    assert spare.recovered - spare.localized == pytest.approx(70.0)
    # The pool has idle machines, so the requeue waits for nothing but its own time.
    assert requeue.queue_wait_s == 0.0
    assert requeue.recovered - requeue.localized == pytest.approx(800.0)
    assert s["spares_used"] == 1
    assert s["evicting_failover_mean_s"] == pytest.approx((70.0 + 800.0) / 2)


def test_controller_node_fault_requeues_even_with_spares() -> None:
    s = simulate(config([incident(1000.0, GPU, slot=0)], spares=UNLIMITED)).summary
    assert s["by_rung"]["requeue"] == 1


def test_restart_budget_stops_and_resubmits() -> None:
    from dataclasses import replace

    from slurm_robust.simulate.job import LadderLimits

    trace = [incident(1000.0 * (i + 1), index=i) for i in range(3)]
    cfg = config(trace, spares=0, limits=replace(LadderLimits(), max_restarts=2))
    result = simulate(cfg)
    rungs = [r.rung for r in result.job.incidents]
    assert rungs == ["in_place", "in_place", "stop"]
    stop = result.job.incidents[-1]
    # Resubmission: the operator's delay, then the scheduling (requeue) time.
    assert stop.recovered - stop.localized == pytest.approx(1800.0 + 800.0)


def test_persistent_fault_recurs_until_the_node_is_blamed() -> None:
    # A persistent network error comes back after each restart; the third failure on the
    # same machine reaches node_failures_to_blame (3) and the ladder evicts it.
    from slurm_robust.simulate.config import FailureClass
    from slurm_robust.simulate.dists import fixed

    net = FailureClass("ib", "network", 1.0, fixed(30.0), fixed(30.0), persistent=1.0)
    trace = [incident(1000.0, net, slot=5, persistent=True, recur_after=(300.0,) * 8)]
    result = simulate(config(trace, spares=2))
    rungs = [r.rung for r in result.job.incidents]
    assert rungs == ["in_place", "in_place", "spare"]
    assert len({r.nodes for r in result.job.incidents}) == 1


def test_unclear_faults_adding_up_on_a_machine_are_diagnosed_not_evicted_by_count() -> None:
    # Three unrelated worker_signal crashes on one machine: the count reaches the threshold,
    # but the class is no evidence against the machine. The simulated stop-time diagnosis
    # passes (the faults are not the machine's: not persistent), so the run goes on in
    # place with the machine kept.
    trace = [incident(1000.0 * (i + 1), slot=5, index=i) for i in range(3)]
    result = simulate(config(trace, spares=2))
    assert [r.rung for r in result.job.incidents] == ["in_place"] * 3
    assert result.summary["spares_used"] == 0


def test_a_persistent_unclear_fault_fails_the_simulated_diagnosis_and_is_evicted() -> None:
    from slurm_robust.simulate.config import FailureClass
    from slurm_robust.simulate.dists import fixed

    hang = FailureClass("hang", "job_hang", 1.0, fixed(30.0), fixed(30.0), persistent=1.0)
    trace = [incident(1000.0, hang, slot=5, persistent=True, recur_after=(300.0,) * 8)]
    result = simulate(config(trace, spares=2))
    rungs = [r.rung for r in result.job.incidents]
    assert rungs == ["in_place", "in_place", "spare"]
    assert "stop-time diagnosis (simulated)" in result.job.incidents[-1].reason


def test_refilled_spares_avoid_the_requeue() -> None:
    trace = [incident(1000.0, GPU, slot=2, index=0), incident(5000.0, GPU, slot=4, index=1)]
    result = simulate(config(trace, spares=1, refill_spares=True))
    # The spare used at the first fault is refilled from the reserve 800 s later.
    assert result.summary["by_rung"]["spare"] == 2
    assert result.summary["by_rung"]["requeue"] == 0


def test_switch_failure_blames_its_block_and_waits_for_machines() -> None:
    from dataclasses import replace

    trace = [incident(1000.0, GPU, slot=40, switch=True)]
    cfg = config(trace, machines=64, spares=2, pool=8)
    cfg = replace(cfg, times=replace(cfg.times, deep_check_fail=0.0))  # all come back
    short = simulate(cfg).job.incidents[0]
    assert short.rung == "requeue" and short.cls == "node_lost"
    assert len(short.nodes) == 32
    # 32 lost slots, 8 idle machines plus the reserve's hand-over: the job waits for the
    # evicted machines' deep checks (15 min) to bring enough back.
    assert short.queue_wait_s == pytest.approx(900.0)
    assert short.recovered - short.localized == pytest.approx(900.0 + 800.0)
    ample = simulate(config(trace, machines=64, spares=2, pool=64)).job.incidents[0]
    assert ample.queue_wait_s == 0.0


def test_a_hang_is_declared_at_the_launchers_limit_for_the_chosen_rule() -> None:
    from dataclasses import replace

    from slurm_robust.simulate.config import FailureClass
    from slurm_robust.simulate.detectors import hang_detection_s
    from slurm_robust.simulate.dists import fixed

    # 10 s steps: declared phases learn max(3 s, 5 x 10 s); the single rule of a plain
    # script is max(20 s floor, 10 x 10 s).
    assert hang_detection_s(10.0) == pytest.approx(50.0)
    assert hang_detection_s(10.0, phases=False) == pytest.approx(100.0)
    assert hang_detection_s(0.5) == pytest.approx(3.0)
    assert hang_detection_s(0.5, phases=False) == pytest.approx(20.0)
    drawn = FailureClass("hang", "job_hang", 1.0, fixed(1.0), fixed(60.0))
    hang = replace(drawn, detect="hang_timeout")  # what the Table 1 mix says for hangs
    trace = [replace(incident(1000.0, drawn, slot=5), fclass=hang)]
    cfg = config(trace, spares=2)
    phases = simulate(cfg).job.incidents[0]
    single = simulate(replace(cfg, hang_phases=False)).job.incidents[0]
    assert phases.detected - phases.fault == pytest.approx(50.0)
    assert single.detected - single.fault == pytest.approx(100.0)


def test_an_outage_at_start_up_takes_the_ladders_backoff_and_then_its_budget() -> None:
    from dataclasses import replace

    from slurm_robust.simulate.config import FailureClass
    from slurm_robust.simulate.dists import fixed
    from slurm_robust.simulate.job import LadderLimits

    hub = FailureClass("hub", "external_service", 1.0, fixed(30.0), fixed(20.0))
    # The first after 100 steps (as before: at once); the others before the next step.
    trace = [incident(1000.5 + i, hub, index=i) for i in range(5)]
    result = simulate(config(trace, spares=0))
    first, *outage = result.job.incidents
    assert first.rung == "in_place" and first.recovered - first.localized == 60.0
    assert [r.rung for r in outage] == ["in_place"] * 4  # past max_no_progress (3)
    assert [r.recovered - r.localized for r in outage] == [70.0, 80.0, 100.0, 140.0]
    assert "restarting in place in 10 s" in outage[0].reason
    # A budget of 200 s: the outage's third failure is decided 120 s after its first
    # (70 s of recovery, 50 s of detection and localisation), the fourth 250 s after.
    cfg = config(trace, spares=0, limits=replace(LadderLimits(), outage_budget_s=200.0))
    rungs = simulate(cfg).job.incidents
    assert [r.rung for r in rungs[:4]] == ["in_place"] * 3 + ["stop"]
    assert rungs[3].reason.startswith("external service unreachable for 5 min: hub")
