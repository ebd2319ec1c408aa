"""The worker side: ``RobustRun.local_check`` before the collective, the anomaly line it
feeds, a poisoned sample (``poison.json``) and the skip list, in a real worker process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from slurm_robust.launcher.classify import EXIT_NONFINITE
from slurm_robust.launcher.node import nan_local

SCRIPT = textwrap.dedent("""
    import sys, torch
    from slurm_robust import train
    run = train.init()
    model = torch.nn.Linear(4, 1)
    params = list(model.parameters())
    for step in range(5):
        if run.should_skip(step + 1):
            run.step_end(step + 1, None, None)
            continue
        loss = model(torch.ones(2, 4)).pow(2).mean()
        if step + 1 == int(sys.argv[1]):
            loss = loss * float("nan")
        model.zero_grad()
        loss.backward()
        run.local_check(step + 1, loss, params, data_position=step)
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        run.step_end(step + 1, float(loss), norm)
    print("done")
""")


def _run(tmp_path, nan_at: int) -> tuple[int, list[dict]]:
    progress = tmp_path / "progress.jsonl"
    env = dict(os.environ, SLURM_ROBUST_PROGRESS=str(progress),
               SLURM_ROBUST_RUN_DIR=str(tmp_path), SLURM_ROBUST_NODE="nodeX", RANK="0",
               WORLD_SIZE="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(nan_at)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    lines = [json.loads(x) for x in progress.read_text().splitlines()] \
        if progress.exists() else []
    return proc.returncode, lines


def test_a_local_nan_is_marked_local_with_its_data_position(tmp_path):
    code, lines = _run(tmp_path, 3)
    assert code == EXIT_NONFINITE
    anomaly = lines[-1]
    assert anomaly["kind"] == "anomaly" and anomaly["step"] == 3
    assert anomaly["local"] is True and anomaly["local_name"] == "loss"
    assert anomaly["data_position"] == 2


def test_a_poisoned_sample_corrupts_the_gradients_at_its_step(tmp_path):
    nan_local.nan_dir(tmp_path).mkdir()
    (nan_local.nan_dir(tmp_path) / nan_local.POISON_FILE).write_text(
        json.dumps({"v": 1, "id": "a", "rank": 0, "step": 4}))
    code, lines = _run(tmp_path, 0)
    assert code == EXIT_NONFINITE
    assert lines[-1]["step"] == 4 and lines[-1]["local_name"] == "local_grad_norm"


def test_skipped_steps_are_not_computed(tmp_path):
    nan_local.nan_dir(tmp_path).mkdir()
    (nan_local.nan_dir(tmp_path) / nan_local.SKIP_FILE).write_text(
        json.dumps({"v": 1, "steps": [3]}))
    code, lines = _run(tmp_path, 3)  # the NaN is in the skipped batch
    assert code == 0
    steps = [x for x in lines if x["kind"] == "step"]
    assert [x["step"] for x in steps] == [1, 2, 3, 4, 5] and steps[2]["loss"] is None


def test_sdc_draws_move_between_attempts():
    r = nan_local.Rehearsal(sdc_probability=0.2, sdc_seed=7)
    hits = [[s for s in range(1, 60) if r.corrupts(s, attempt)] for attempt in range(3)]
    assert all(hits) and len({tuple(h) for h in hits}) == 3


def test_non_finite_names_the_value():
    assert nan_local.non_finite(float("nan"), 1.0) == "loss"
    assert nan_local.non_finite(1.0, float("inf")) == "local_grad_norm"
    assert nan_local.non_finite(1.0, 2.0) is None and nan_local.non_finite(None, None) is None


def test_a_replay_group_sees_the_corruption_in_its_window():
    """A dual-phase replay replays a window of 17 steps; at p=0.5 the corrupt node's
    group must show it. Sparing the previous attempt's steps there (that attempt is
    another group's) left such windows clean for some seeds."""
    window = range(15, 32)
    spared = [seed for seed in range(400) if not any(
        nan_local.Rehearsal(sdc_probability=0.5, sdc_seed=seed).corrupts(s, 9)
        for s in window)]
    assert spared  # the ladder's rule alone misses some windows
    assert not [seed for seed in range(400) if not any(
        nan_local.Rehearsal(sdc_probability=0.5, sdc_seed=seed).corrupts(s, 9, True)
        for s in window)]
