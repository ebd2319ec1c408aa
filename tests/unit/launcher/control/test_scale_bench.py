"""``bench scale`` at a tiny size: the real controller in its own process, simulated
agents over the wire protocol, and an injected failure that must be decided."""

from __future__ import annotations

import argparse

from slurm_robust_rehearsal.bench import scale


def test_scale_bench_runs_and_decides_the_injected_failure():
    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    args = parser.parse_args(["--agents", "8", "--seconds", "2", "--recover-s", "4",
                              "--heartbeat-s", "0.2"])
    out = scale.run(args)
    assert out["agents"] == 8 and out["harness_procs"] == 1
    ctl = out["controller"]
    assert ctl["cores"] > 0 and ctl["rss_mib"] > 0 and ctl["threads"] > 1 and ctl["fds"] > 8
    assert out["rtt_ms"]["n"] > 0 and out["rtt_ms"]["p50"] is not None
    assert out["reports"]["served"] > 0 and out["reports"]["offered_per_s"] == 40.0
    assert out["agents_lost"] == 0, out["lost_in_log"]
    fail = out["failure"]
    assert fail["decided"] and fail["agents_without_new_plan"] == 0
    assert fail["failure_to_decision_s"] is not None and fail["failure_to_decision_s"] > 0
    assert fail["fanout_s"]["n"] == 8
    assert set(out["targets"]) == set(scale.TARGETS)
    assert out["harness"]["cpu_cores"] > 0
    # Most replies are "unchanged" (about 60 bytes): a full plan at 8 x 8 is about 500.
    assert 0 < out["harness"]["reply_bytes_mean"] < 300


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert scale.pct(values, 50) == 50.0 and scale.pct(values, 99) == 99.0
    assert scale.pct([], 99) is None


def test_lost_agents_are_read_from_the_controller_log_once_each(tmp_path):
    log = tmp_path / "controller.log"
    log.write_text(
        "10.0 slurm_robust.launcher.control.controller WARNING agent 3 on n3 lost "
        "(heartbeat timeout)\n"
        "11.0 slurm_robust.launcher.control.controller WARNING agent 3 on n3 reported "
        "after it was declared lost (gen 1); told to stand down\n"
        "12.0 slurm_robust.launcher.control.controller WARNING agent 5 on n5 lost "
        "(connection closed)\n")
    assert set(scale.lost_in_log(log, 11.5)) == {"3"}
    assert set(scale.lost_in_log(log, 20.0)) == {"3", "5"}


def test_push_rounds_are_read_from_the_controller_log(tmp_path):
    import logging

    from slurm_robust.launcher.control import report_loop
    log = tmp_path / "controller.log"
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(created).3f %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger(report_loop.__name__)
    logger.addHandler(handler)
    old, logger.level = logger.level, logging.INFO
    try:
        logger.info("%s %d plans in %.3f s", report_loop.PUSHED_LINE, 4096, 0.152)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
        handler.close()
    (t, plans, seconds), = scale.pushes_in_log(log, 0.0)
    assert plans == 4096 and seconds == 0.152 and t > 0
    assert scale.pushes_in_log(log, t + 1.0) == []


def test_a_stalled_tick_and_a_cpu_hog_cost_no_agent_and_are_recorded():
    # The tick stalls for two heartbeat timeouts with a busy process beside it; the
    # simulated agents give up on their answers after one and reconnect, as real ones.
    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    args = parser.parse_args(["--agents", "8", "--seconds", "4", "--recover-s", "3",
                              "--heartbeat-timeout-s", "1.0", "--stall-tick-s", "2.0",
                              "--cpu-hog", "1"])
    out = scale.run(args)
    assert out["agents_lost"] == 0, (out["lost_in_log"], out["lost_plans"])
    stress = out["stress"]
    assert stress["stalls"] == 1 and stress["cpu_hog"] == 1
    assert stress["overload_events"] >= 1 and stress["overload_warnings"] >= 1
    assert stress["overload_lag_max_s"] >= 1.5
    assert out["harness"]["gave_up"] >= 1  # the closed path was exercised
    assert out["failure"]["decided"]
