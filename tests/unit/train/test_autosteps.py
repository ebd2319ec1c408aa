"""--auto-steps: an unmodified script's optimizer steps reach the progress channel, and
the restored step is learned from the script's own torch.save/torch.load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PLAIN = REPO / "examples" / "train_plain.py"


def run_shim(tmp_path: Path, name: str, *args: str) -> list[dict]:
    progress = tmp_path / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env.update(SLURM_ROBUST_PROGRESS=str(progress), SLURM_ROBUST_RUN_DIR=str(tmp_path),
               RANK="0", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "slurm_robust.autosteps", str(PLAIN),
                          "--out_dir", str(tmp_path / "out"), "--max_iters", "12",
                          "--ckpt_interval", "5", "--grad_accum", "2", *args],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in progress.read_text().splitlines()]


def test_steps_losses_and_restored_step(tmp_path):
    first = run_shim(tmp_path, "a")
    steps = [i for i in first if i["kind"] == "step"]
    assert [i["step"] for i in steps] == list(range(1, 13))  # one per optimizer step
    assert all(isinstance(i["loss"], float) and i["busy_s"] > 0 for i in steps)
    assert first[-1]["kind"] == "final" and first[-1]["step"] == 12
    saves = json.loads((tmp_path / "autosteps" / "saves-rank0.json").read_text())
    assert saves["saves"][str(tmp_path / "out" / "ckpt.pt")] == 10  # last save: iter 10

    again = run_shim(tmp_path, "b", "--init_from=resume", "--max_iters", "14")
    assert again[0] == {"kind": "restored", "step": 10, "tier": None,
                        "source": str(tmp_path / "out" / "ckpt.pt")}
    assert [i["step"] for i in again if i["kind"] == "step"] == [11, 12, 13, 14]


def test_without_a_progress_channel_it_only_runs_the_script(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_ROBUST")}
    out = subprocess.run([sys.executable, "-m", "slurm_robust.autosteps", str(PLAIN),
                          "--out_dir", str(tmp_path), "--max_iters", "2"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "done: 2 iterations" in out.stdout
    assert not (tmp_path / "autosteps").exists()
