"""torchrun parity of the worker environment, the resume options, the interpreter check."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest

from slurm_robust.ckpt import CheckpointConfig
from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.messages import Plan
from slurm_robust.launcher.node.workers import worker_env
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit.options import add_robust_options, build_config
from slurm_robust.scriptenv import interpreter_warning, worker_command

PLAN = Plan(role=Role.ACTIVE, gen=1, ranks=[2, 3], world_size=4, slot=1, master_addr="n1",
            master_port=1, attempt=2, max_restarts=5, run_id="abc", rank_nodes=["a"] * 4)


def env_of(base: dict[str, str], plan=PLAN) -> dict[str, str]:
    return worker_env(base, plan, 3, 1, "n2", "7", "/r", Path("/p"), CheckpointConfig(), {})


def test_worker_env_matches_torchrun_names():
    env = env_of({"SLURM_RESTART_COUNT": "1"})
    assert env["OMP_NUM_THREADS"] == "1"  # two processes on this node
    assert (env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == \
        ("2", "1", "2")
    assert (env["ROLE_NAME"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("default", "3", "4")
    assert env["TORCHELASTIC_RUN_ID"] == "abc"
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "5"
    assert env["TORCHELASTIC_RESTART_COUNT"] == env["SLURM_ROBUST_RESTART_COUNT"] == "2"
    assert env["SLURM_ROBUST_ATTEMPT"] == "2"
    assert env["SLURM_RESTART_COUNT"] == "1"  # Slurm's own, passed through
    assert env["SLURM_ROBUST_PROGRESS"] == "/p"


def test_omp_threads_kept_when_set_and_not_forced_for_one_process():
    assert env_of({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"
    single = dataclasses.replace(PLAN, ranks=[3])
    assert "OMP_NUM_THREADS" not in env_of({}, single)


def test_resume_args_from_first_restart_when_the_file_exists(tmp_path):
    cmd = ["python", "train.py"]
    args = ["--init_from=resume"]
    assert worker_command(cmd, 0, args, "out/ckpt.pt", cwd=tmp_path) == cmd
    assert worker_command(cmd, 1, args, "out/ckpt.pt", cwd=tmp_path) == cmd
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"x")
    assert worker_command(cmd, 0, args, "out/ckpt.pt", cwd=tmp_path) == cmd
    assert worker_command(cmd, 1, args, "out/ckpt.pt", cwd=tmp_path) == cmd + args
    assert worker_command(cmd, 3, args, None, cwd=tmp_path) == cmd + args


def test_auto_steps_wraps_a_python_command():
    assert worker_command(["python3", "t.py", "--x"], 0, auto_steps=True) == \
        ["python3", "-m", "slurm_robust.autosteps", "t.py", "--x"]
    with pytest.raises(UsageError, match="auto-steps needs a Python command"):
        RunConfig(command=("./train.sh",), run_dir="/tmp/r", auto_steps=True)


def test_options_nproc_alias_and_resume(tmp_path):
    p = argparse.ArgumentParser()
    add_robust_options(p)
    args = p.parse_args(["--nproc-per-node", "2", "--folder", str(tmp_path),
                         "--resume-args", "--init_from=resume --x 1",
                         "--resume-if-exists", "out/ckpt.pt", "--startup-timeout", "60",
                         "--", sys.executable, "t.py"])
    cfg = build_config(args, 1, None)
    assert cfg.workers_per_node == 2 and cfg.startup_timeout_s == 60.0
    assert cfg.resume_args == ("--init_from=resume", "--x", "1")
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_interpreter_warning(tmp_path):
    assert interpreter_warning([sys.executable, "t.py"]) is None
    assert interpreter_warning(["bash", "t.sh"]) is None
    assert "not on PATH" in (interpreter_warning(["python-nope-3", "t.py"]) or "")
    fake = tmp_path / "python9"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    assert "cannot import torch" in (interpreter_warning([str(fake), "t.py"]) or "")


def test_logs_are_per_attempt(tmp_path):
    paths = RunPaths.of(tmp_path)
    assert paths.worker_log(1, 0, 0) != paths.worker_log(1, 0, 3)
    assert paths.worker_log(1, 0, 3).parts[-3:] == ("attempt3", "gen1", "rank0.log")


def test_resume_args_value_may_start_with_a_dash():
    from slurm_robust.cli.main import glue_dash_values

    assert glue_dash_values(["submit", "--resume-args", "--init_from=resume", "--",
                             "python", "--resume-args", "x"]) == \
        ["submit", "--resume-args=--init_from=resume", "--", "python", "--resume-args", "x"]
