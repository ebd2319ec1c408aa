"""The fleet generator's ground truth, and the benchmark's output shape."""

from __future__ import annotations

import argparse

import pytest

from slurm_robust.analysis.pipeline import analyse
from slurm_robust_rehearsal.bench import analysis as bench
from slurm_robust_rehearsal.synth.fleet import synth_fleet


def test_fleet_analysis_reproduces_the_generators_truth():
    inputs, truth = synth_fleet(3000, seed=7)
    head = analyse(inputs).headline()
    assert head["ettr"] == pytest.approx(truth.productive_s / truth.wall_s, rel=1e-9)
    assert head["incidents"] == truth.incidents > 200
    assert head["steps_redone"] == truth.steps_redone
    assert {k: v for k, v in head["by_rung"].items() if v} == dict(truth.by_rung)
    assert head["fleet"]["requeued_jobs"] == truth.by_rung["requeue"]


def test_bench_runs_each_size_in_a_child_and_checks_answers():
    out = bench.run(argparse.Namespace(jobs=[2000, 1000], seed=1))
    assert [r["jobs"] for r in out["sizes"]] == [1000, 2000]
    assert all(r["checks_pass"] for r in out["sizes"])
    assert all(r["peak_rss_mib"] > 0 and r["analyse_s"] > 0 for r in out["sizes"])
    assert "target" not in out  # only reported when a 1M-job size ran
