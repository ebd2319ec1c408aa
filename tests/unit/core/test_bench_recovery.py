"""bench recovery's parts that need no cluster: the peers' batch scripts, the arm choice
(ft_launcher present or not) and the summary of counted rounds."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust_rehearsal.bench import recovery

WORKER = [str(recovery.EXAMPLE), "--steps", "40", "--ckpt-dir", "/shared/x y/ckpt",
          "--ckpt-format", "dcp_async"]


def _srun_words(script: str) -> list[str]:
    """The agent's words: ``srun ... sh -c 'exec AGENT ...'`` unwrapped."""
    line = next(ln for ln in script.splitlines() if ln.startswith("srun "))
    outer = shlex.split(line)
    assert outer[2:4] == ["sh", "-c"] and outer[4].startswith("exec ")
    agent, _, worker = outer[4].partition(" " + recovery.LOCAL_ADDR + " ")
    assert worker, "each agent finds its own address"
    return outer[:2] + shlex.split(agent)[1:] + shlex.split(worker)


def test_ft_launcher_script_runs_one_agent_per_node_like_the_torchrun_arm():
    ft = recovery.ft_launcher_script("/opt/ft venv/bin/ft_launcher", 3, 3, 40250, "bench-ftl",
                                     WORKER)
    tr = recovery.torchrun_script(3, 3, 40500, "bench", WORKER)
    ft_words, tr_words = _srun_words(ft), _srun_words(tr)
    assert ft_words[:3] == ["srun", "--kill-on-bad-exit=0", "/opt/ft venv/bin/ft_launcher"]
    assert ft_words[3:9] == ["--nnodes=3", "--nproc-per-node=1", "--max-restarts=3",
                             "--rdzv-backend=c10d", "--rdzv-endpoint=$RDZV_HOST:40250",
                             "--rdzv-id=bench-ftl$SLURM_JOB_ID"]
    # torchrun's arm: the same options and worker after its module (its own port and id).
    after_module = tr_words[tr_words.index("torch.distributed.run") + 1:]
    assert after_module[:4] == ft_words[3:7]
    assert ft_words[9:] == after_module[6:] == WORKER
    # torchrun's store-per-round variable is for torchrun only (see ft_launcher_script).
    assert recovery.TORCHRUN_ENV in tr and "TORCH_DISABLE" not in ft
    # The rendezvous host is the first node's address, found by the script (a namespaced
    # node's 127.0.0.1 is its own).
    assert recovery.RDZV_HOST in ft.splitlines() and recovery.RDZV_HOST in tr.splitlines()


def test_ft_launcher_script_leaves_the_job_id_to_the_shell(tmp_path):
    script = recovery.ft_launcher_script("/bin/echo", 2, 3, 40250, "p", ["w.py", "--a", "b c"])
    path = tmp_path / "job.sh"
    path.write_text(script.replace("srun --kill-on-bad-exit=0 ", ""))
    bin_dir = tmp_path / "bin"  # a scontrol that answers as Slurm does for one node
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\ncase "$2" in hostnames) echo n1;; '
        '*) echo "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.$3 NodeHostName=$3";; esac\n')
    (bin_dir / "scontrol").chmod(0o755)
    out = subprocess.run(["sh", str(path)], env={"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "7",
                                                 "SLURM_JOB_NODELIST": "n1",
                                                 "PATH": f"{bin_dir}:/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout
    assert "--rdzv-endpoint=10.0.0.n1:40250 --rdzv-id=p77 --local-addr=10.0.0.7 w.py --a b c" \
        in out


def test_ft_launcher_is_found_by_path_beside_the_interpreter_or_on_path(tmp_path, monkeypatch):
    exe = tmp_path / "ft_launcher"
    exe.write_text("#!/bin/sh\n")
    assert recovery.find_ft_launcher(str(exe)) is None  # not executable
    exe.chmod(0o755)
    assert recovery.find_ft_launcher(str(exe)) == str(exe)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert recovery.find_ft_launcher(None) == str(exe)
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert recovery.find_ft_launcher(None) == str(exe)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert recovery.find_ft_launcher(None) is None


def test_without_ft_launcher_the_arm_is_skipped_and_the_json_says_how_to_enable_it():
    arms, not_measured = recovery.select_arms(None, None)
    assert arms == ["plain", "torchrun", "robust"]
    how = not_measured[recovery.FT_LAUNCHER_KEY]
    assert "pip install" in how and "nvidia-resiliency-ext==0.4.1" in how
    assert "--ft-launcher" in how and str(recovery.REPO) in how
    with pytest.raises(SlurmRobustError, match="nvidia-resiliency-ext==0.4.1"):
        recovery.select_arms("ft_launcher,torchrun", None)


def test_arms_are_chosen_by_name_in_a_fixed_order():
    assert recovery.select_arms(None, "/x/ft_launcher") == (list(recovery.ARMS), {})
    assert recovery.select_arms("torchrun, ft_launcher", "/x/ft_launcher") == (
        ["torchrun", "ft_launcher"], {})
    arms, not_measured = recovery.select_arms("robust,plain", "/x/ft_launcher")
    assert arms == ["plain", "robust"]
    assert not_measured == {recovery.FT_LAUNCHER_KEY: "not in --arms"}
    for bad in ("torchrun,tochrun", " , "):
        with pytest.raises(UsageError, match="--arms"):
            recovery.select_arms(bad, None)


def _round(s2n: float, redone: int, sha: str | None = "abc") -> dict[str, object]:
    return {"fault_to_next_step_s": s2n, "steps_redone": redone, "params_sha256": sha}


def test_summary_gives_ft_launcher_its_spread_and_speedup_within_the_10x_target():
    runs = {"plain": [_round(30.0, 5)], "torchrun": [_round(12.0, 5)],
            "ft_launcher": [_round(14.0, 5)], "robust": [_round(1.0, 0)]}
    out = recovery.summarise(runs, hold=20)
    assert out["fault_to_next_step_s"]["ft_launcher_max_restarts_dcp_async_save"]["median"] \
        == 14.0
    speed = out["speedup_fault_to_next_step"]
    assert speed["vs_ft_launcher"]["median"] == 14.0 and speed["vs_torchrun_dcp"]["median"] \
        == 12.0
    assert speed["vs_plain_default_hold_computed"]["median"] == 130.0
    assert out["steps_redone"]["ft_launcher"]["median"] == 5
    assert out["targets"] == {"speedup_ge_10x_vs_each_restart_from_disk_peer": True,
                              "no_step_redone": True, "same_final_params": True}
    # ft_launcher 9x slower than the robust arm misses the target on its own.
    runs["ft_launcher"] = [_round(9.0, 5)]
    assert not recovery.summarise(runs, 20)["targets"][
        "speedup_ge_10x_vs_each_restart_from_disk_peer"]


def test_summary_of_a_subset_keeps_every_key_with_null_figures():
    runs = {"torchrun": [_round(12.0, 5)], "ft_launcher": [_round(14.0, 5, "other")]}
    out = recovery.summarise(runs, hold=20)
    assert out["fault_to_next_step_s"]["slurm_robust"] is None
    assert out["fault_to_next_step_s"]["plain_requeue_hold_20s_measured"] is None
    assert set(out["speedup_fault_to_next_step"]) == {
        "vs_torchrun_dcp", "vs_ft_launcher", "vs_plain_mini_cluster_hold",
        "vs_plain_default_hold_computed"}
    assert all(v is None for v in out["speedup_fault_to_next_step"].values())
    assert out["same_final_params"] is False  # two arms, two digests
    assert out["targets"]["speedup_ge_10x_vs_each_restart_from_disk_peer"] is False
    assert out["targets"]["no_step_redone"] is None


def test_example_runs_unchanged_without_ft_launcher(tmp_path):
    # The heartbeat client is only looked for under ft_launcher; elsewhere the example
    # needs no nvidia_resiliency_ext.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FT_")}
    env["PYTHONPATH"] = str(Path(recovery.REPO))
    out = subprocess.run([sys.executable, str(recovery.EXAMPLE), "--steps", "2", "--layers",
                          "1", "--d-model", "16", "--seq", "8"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "params_sha256=" in out.stdout


def test_a_step_in_flight_at_the_kill_is_not_the_peers_recovery(tmp_path):
    # Seen in a four-arm run: rank 0 logged step 76 just after rank 2 was killed (their
    # all-reduce had finished), and the ft_launcher round measured 0.0 s. The restarted
    # run redoes from its last save (70), so its first step is at most the last one
    # before the kill.
    from slurm_robust_rehearsal.bench.arms.peers import first_after as _first_after

    progress = tmp_path / "progress.txt"
    progress.write_text("74 100.0\n75 100.2\n76 100.41\n71 108.9\n72 109.1\n")
    assert _first_after(progress, 100.4) == (76, 100.41)
    assert _first_after(progress, 100.4, at_most=75) == (71, 108.9)
    assert _first_after(progress, 109.5, at_most=75) is None
