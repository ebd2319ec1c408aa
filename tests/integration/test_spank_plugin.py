"""The SPANK plugin on the real mini-cluster: options on sbatch/srun/salloc, values in
the job's environment, bad values refused at submission, and trusted task-exit records
in the node's journal (SIGKILL told apart from exit 3; a user cannot forge the node).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from cluster_helpers import wait_until as _wait_until

from slurm_robust.records import TASK_EXIT_SCHEMA, read_records
from slurm_robust.slurm import RetryPolicy, SlurmCommandError, run_slurm_command
from slurm_robust_rehearsal.cluster.templates import SPANK_PLUGIN

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not SPANK_PLUGIN.exists(),
                       reason=f"{SPANK_PLUGIN} is not built: run `make -C spank`"),
]


def wait_until(what, probe, timeout_s=120.0, interval_s=0.3):
    return _wait_until(what, probe, timeout_s, interval_s)

ONCE = RetryPolicy(attempts=1)
OPTIONS = ["--robust=[PROFILE]", "--robust-spares=K", "--robust-ckpt-every=N",
           "--robust-hang-timeout=SECONDS"]


@pytest.fixture(scope="module")
def cluster(minicluster):
    conf = minicluster.cfg.plugstack_conf.read_text()
    assert str(SPANK_PLUGIN) in conf, f"cluster up did not list the plugin in {conf!r}"
    return minicluster


def _out_dir(cluster, name: str) -> Path:
    path = cluster.cfg.shared_dir / "tests" / "spank" / name
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o1777)
    return path


def _finish(cluster, job_id: str) -> None:
    s = cluster.slurm
    wait_until(f"job {job_id} to end", lambda: (j := s.job(job_id)) is not None and j.finished)


def _journal(cluster, node: str) -> Path:
    return cluster.cfg.node_dir(node) / "state" / "task_exit.jsonl"


def _records(cluster, node: str, job_id: str) -> dict[tuple[str, int], dict]:
    result = read_records(_journal(cluster, node), schema=TASK_EXIT_SCHEMA)
    return {(r["step_id"], r["task_id"]): r for r in result.records
            if r.get("job_id") == job_id}


# The variables the plugin sets (other SLURM_ROBUST_* names belong to the project).
PLUGIN_VARS = {"SLURM_ROBUST", "SLURM_ROBUST_SPARES", "SLURM_ROBUST_CKPT_EVERY",
               "SLURM_ROBUST_HANG_TIMEOUT"}


def _env_lines(text: str, prefix: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line[len(prefix):].partition("=")
            if key in PLUGIN_VARS:
                out[key] = value
    return out


@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc"])
def test_help_lists_the_robust_options(cluster, command):
    proc = run_slurm_command([command, "--help"], env=cluster.env, policy=ONCE)
    text = proc.stdout + proc.stderr
    assert "Options provided by plugins" in text
    for opt in OPTIONS:
        assert opt in text, f"{command} --help lacks {opt}"


def test_job_sees_validated_values_in_its_environment(cluster):
    out = _out_dir(cluster, "env")
    script = ("#!/bin/bash\n"
              "env | grep '^SLURM_ROBUST' | sed 's/^/batch:/'\n"
              "srun -n1 env | grep '^SLURM_ROBUST' | sed 's/^/step:/'\n"
              "srun -n1 --robust-spares=2 env | grep '^SLURM_ROBUST' | sed 's/^/over:/'\n")
    job_id = cluster.slurm.sbatch(["-N1", "-p", "train", "--robust-spares=1",
                                   "-o", str(out / "%j.out")], script=script)
    _finish(cluster, job_id)
    assert cluster.slurm.job(job_id).state == "COMPLETED"
    text = (out / f"{job_id}.out").read_text()
    expected = {"SLURM_ROBUST": "default", "SLURM_ROBUST_SPARES": "1"}
    assert _env_lines(text, "batch:") == expected, text
    assert _env_lines(text, "step:") == expected, text
    assert _env_lines(text, "over:") == {**expected, "SLURM_ROBUST_SPARES": "2"}, text


@pytest.mark.parametrize("export", ["ALL", "NONE"])
def test_profile_and_every_option_reach_the_job(cluster, export):
    out = _out_dir(cluster, "profile")
    job_id = cluster.slurm.sbatch(
        ["-N1", "-p", "train", f"--export={export}", "--robust=fast",
         "--robust-ckpt-every=50", "--robust-hang-timeout=120", "-o", str(out / "%j.out")],
        script="#!/bin/bash\n/usr/bin/env | /bin/sed -n 's/^SLURM_ROBUST/batch:&/p'\n")
    _finish(cluster, job_id)
    got = _env_lines((out / f"{job_id}.out").read_text(), "batch:")
    assert got == {"SLURM_ROBUST": "fast", "SLURM_ROBUST_CKPT_EVERY": "50",
                   "SLURM_ROBUST_HANG_TIMEOUT": "120"}
    if export == "ALL":
        # slurmstepd validated and set them itself, and said so in the node's log. (With
        # --export=NONE Slurm 22.05 does not forward the options to the batch step; the
        # values arrive through sbatch's SLURM_* environment, which is always exported.)
        line = (f"slurm_robust: slurmstepd: job {job_id} step batch: SLURM_ROBUST=fast "
                "SLURM_ROBUST_CKPT_EVERY=50 SLURM_ROBUST_HANG_TIMEOUT=120")
        logs = [p.read_text(errors="replace") for p in cluster.cfg.log_dir.glob("slurmd-*.log")]
        assert any(line in text for text in logs)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--robust-spares=abc", "--robust-spares: 'abc' is not a whole number from 0 to 64"),
        ("--robust-spares=65", "--robust-spares: 65 is out of range"),
        ("--robust-spares=-1", "--robust-spares: '-1' is not a whole number"),
        ("--robust-ckpt-every=0", "--robust-ckpt-every: 0 is out of range"),
        ("--robust-hang-timeout=1h", "--robust-hang-timeout: '1h' is not a whole number"),
        ("--robust=../etc", "--robust: '../etc' is not a profile name"),
    ],
)
def test_invalid_value_is_refused_at_submission(cluster, option, message):
    with pytest.raises(SlurmCommandError) as info:
        cluster.slurm.sbatch(["-N1", "-p", "train", option], script="#!/bin/sh\ntrue\n")
    assert f"slurm_robust: option: {message}" in info.value.stderr


@pytest.mark.parametrize("command", ["srun", "salloc"])
def test_srun_and_salloc_refuse_invalid_values_too(cluster, command):
    proc = run_slurm_command([command, "-N1", "--robust-spares=x", "true"], env=cluster.env,
                             policy=ONCE, check=False)
    assert proc.returncode != 0
    assert "slurm_robust: option: --robust-spares: 'x' is not a whole number" in proc.stderr


def test_sigkill_and_exit_3_leave_correct_records(cluster):
    """Two tasks of one step on two nodes: task 1 exits 3, task 0 is then SIGKILLed."""
    out = _out_dir(cluster, "exits")
    script = ("#!/bin/bash\n"
              "srun -N2 -n2 -l printenv SLURMD_NODENAME\n"
              "srun -N2 -n2 bash -c "
              "'if [ \"$SLURM_PROCID\" = 1 ]; then exit 3; fi; sleep 1; kill -9 $$'\n"
              "exit 0\n")
    t0 = time.time()
    job_id = cluster.slurm.sbatch(["-N2", "-p", "train", "-o", str(out / "%j.out")],
                                  script=script)
    _finish(cluster, job_id)
    nodes = dict(line.split(": ", 1) for line in
                 (out / f"{job_id}.out").read_text().splitlines() if ": " in line
                 and line.split(": ", 1)[0] in ("0", "1"))
    node0, node1 = nodes["0"].strip(), nodes["1"].strip()
    assert node0 != node1
    killed = wait_until("record of task 0", lambda: _records(cluster, node0, job_id)
                        .get(("1", 0)), timeout_s=30)
    exited = wait_until("record of task 1", lambda: _records(cluster, node1, job_id)
                        .get(("1", 1)), timeout_s=30)
    assert (killed["signal"], killed["exit_code"], killed["wait_status"]) == (9, None, 9)
    assert (exited["exit_code"], exited["signal"], exited["wait_status"]) == (3, None, 3 << 8)
    for rec, node in ((killed, node0), (exited, node1)):
        assert rec["node"] == node and rec["v"] == 1 and rec["pid"] > 0
        assert t0 - 1 <= rec["time"] <= time.time() + 1
        assert rec["core_dumped"] is False and rec["restart_count"] == 0
    batch = _records(cluster, node0, job_id).get(("batch", 0))
    assert batch is not None and batch["exit_code"] == 0


def test_user_cannot_forge_the_node_or_write_the_journal(cluster):
    """An unprivileged job that sets SLURMD_NODENAME still gets its real node recorded."""
    out = _out_dir(cluster, "user")
    user = cluster.cfg.user
    env = dict(cluster.env, SLURMD_NODENAME="forged")
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", "-N1", "-p", "train",
         "--robust", "-o", str(out / "%j.out"), "--wrap",
         "srun -n1 bash -c 'kill -9 $$'"],
        env=env, capture_output=True, text=True, timeout=30, cwd=str(out))
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    _finish(cluster, job_id)
    rows = wait_until("sacct row", lambda: [r for r in cluster.slurm.sacct([job_id])
                                           if r.nodes], timeout_s=30)
    node = rows[0].nodes[0]
    rec = wait_until("record", lambda: _records(cluster, node, job_id).get(("0", 0)),
                     timeout_s=30)
    assert rec["node"] == node != "forged" and rec["signal"] == 9
    journal = _journal(cluster, node)
    st = journal.stat()
    assert st.st_uid == 0 and st.st_mode & 0o022 == 0
    write = subprocess.run(["runuser", "-u", user, "--", "sh", "-c",
                            f"echo forged >> {journal}"],
                           capture_output=True, text=True, timeout=30)
    assert write.returncode != 0
    assert "forged" not in journal.read_text()
