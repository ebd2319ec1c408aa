"""Hang limits per phase on the real mini-cluster: long declared sections raise nothing,
a worker stopped between half-second steps is declared hung within 5 s.

examples/train_gpt.py with ``--section``: a 10 s ``eval`` section every 10 steps and an
8 s ``save`` section every 15, half-second steps. The run keeps test_launcher_faults.py's
8 s hang floor (``--hang-timeout 8``): under the single rule every section would be a
hang; with declared phases the sections get their own limits (the first of each the
never-timed 1800 s, later ones 3 x their duration) and the steady steps max(3 s, 5 x p95).
Rank 0 is SIGSTOPped (``slurm-robust inject stop-worker``) after the second evaluation.
About 65 s from submission to the end.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from test_launcher_faults import CLI, REPO, Run, standalone_sha

from slurm_robust.launcher.control.state import load_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = 28
SECTION_ARGS = ["--steps", str(STEPS), "--min-step-time", "0.5",
                "--section", "eval:10:10", "--section", "save:15:8"]
#: The promise: a worker stopped in steady state is declared hung within this long.
DETECT_S = 5.0


@pytest.fixture
def run(minicluster):
    started = Run(minicluster, "phases", spares=0, train_args=SECTION_ARGS)
    yield started
    started.cancel()


def test_sections_raise_nothing_and_a_stopped_worker_is_hung_within_5_s(run):
    run.wait_step(21, timeout=120.0)  # both evaluations and the save are behind
    injected = run.inject("stop-worker", "--rank", "0")
    end = run.wait_end(timeout=180.0)
    baseline = standalone_sha(STEPS)  # sections do not change the parameters

    incidents = run.events("incident")
    assert len(incidents) == 1, incidents  # no section was taken for a hang
    inc = incidents[0]
    assert (inc["class"], inc["rung"]) == ("job_hang", "in_place")
    assert inc["ranks"] == [0]
    limit = inc["evidence"]["hang_limit"]
    # The steps limit is max(3 s, 5 x p95 step): at steady 0.5 s steps 3 s, detection
    # within DETECT_S (the unit tests prove that on a fake clock). On a loaded machine
    # steps jitter, and with the 20-odd step times a short run has, p95 is the slowest
    # one: one 3.1 s step made the limit 15.5 s in a run here. So the limit is bounded by
    # the step times the controller measured (state.json), and detection by the limit.
    state = load_state(run.paths.state)
    bound = max(3.0, 5.0 * max(state.phase_times["steps"]))
    assert limit["phase"] == "steps" and limit["limit_s"] <= 1.05 * bound, (limit, bound)
    assert inc["detected_at"] - injected["time"] <= \
        max(DETECT_S, limit["limit_s"] + 2.5), (inc, limit)
    assert end["status"] == "completed" and end["params_sha256"] == baseline

    assert state.declares_phases
    # A section lasts its sleep plus the slowest rank's arrival (a step or two).
    assert all(9.0 <= d <= 15.0 for d in state.phase_times["eval"]), state.phase_times
    assert all(7.0 <= d <= 13.0 for d in state.phase_times["save"]), state.phase_times
    out = subprocess.run([*CLI, "status", run.run_dir, "--json"], env=run.env,
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    limits = json.loads(out.stdout)["hang_limits"]
    assert limits["steps"] <= 1.05 * bound and 27.0 <= limits["eval"] <= 45.0, limits

