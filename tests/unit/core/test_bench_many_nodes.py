"""bench many-nodes' parts that need no cluster: its option checks and the report it makes
of a run's event log (its standalone reference: test_standalone_digest.py)."""

from __future__ import annotations

import argparse

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.control.events import EventLog
from slurm_robust.launcher.paths import RunPaths
from slurm_robust_rehearsal.bench import many_nodes


def _args(**kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    many_nodes.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in kw.items():
        setattr(args, key, value)
    return args


@pytest.mark.parametrize("kw", [{"nodes": 2}, {"spares": 0},
                                {"kill_worker_step": 80, "kill_node_step": 70},
                                {"kill_node_step": 120, "steps": 120}])
def test_options_that_cannot_make_the_rehearsal_are_refused_before_any_job(kw):
    with pytest.raises(UsageError):
        many_nodes._check(_args(**kw), slurm=None)  # refused before Slurm is asked


def test_the_report_times_each_incident_from_its_fault_and_checks_the_ladder(tmp_path):
    paths = RunPaths.of(str(tmp_path))
    log = EventLog(paths.events, "run", "7", max_per_s=0)
    t0 = 1000.0
    for step in range(1, 6):
        log.emit("step", {"step": step, "step_time_s": 0.5}, now=t0 + step)
    faults = [{"fault": "kill-worker", "time": t0 + 5.5},
              {"fault": "kill-node", "node": "node5", "time": t0 + 20.0}]
    log.attempt = 1
    log.emit("incident", {"class": "worker_signal", "rung": "in_place", "restore_tier": "memory",
                          "steps_lost": 0, "detected_at": t0 + 5.6, "recovered_at": t0 + 6.5},
             now=t0 + 6.5)
    log.emit("step", {"step": 6, "step_time_s": 0.5}, now=t0 + 7.0)
    log.attempt = 2
    log.emit("incident", {"class": "node_lost", "rung": "spare", "restore_tier": "peer",
                          "steps_lost": 1, "detected_at": t0 + 24.0, "recovered_at": t0 + 27.0},
             now=t0 + 27.0)
    log.emit("step", {"step": 7, "step_time_s": 0.5}, now=t0 + 28.0)
    status = {"status": "completed", "params_sha256": "abc"}
    out = many_nodes._report(_args(), paths, "7", faults, status, "abc", 3.0, t0, 30.0)
    assert [(r["fault"], r["rung"], r["detected_s"], r["recovered_s"], r["next_step_s"])
            for r in out["incidents"]] == [("kill-worker", "in_place", 0.1, 1.0, 1.5),
                                           ("kill-node", "spare", 4.0, 7.0, 8.0)]
    assert out["startup_s"] == 1.0 and out["step_time_s_mean"] == 0.5
    assert out["digest_equal"] and out["targets"]["met"]
    # Another digest, or a rung the ladder should not have taken, is not met.
    assert not many_nodes._report(_args(), paths, "7", faults, status, "other", 3.0, t0,
                                  30.0)["targets"]["met"]
    assert not many_nodes._report(_args(), paths, "7", faults[::-1], status, "abc", 3.0, t0,
                                  30.0)["targets"]["met"]
