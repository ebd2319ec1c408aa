"""The run directory is a trust boundary: a second user (`mallory`) plants a run directory
before the victim (`robust`) uses it.

1. mallory pre-creates the run directory robust will pass to `submit --folder`, writable by
   all, with a planted `versions/current.json` naming a version whose command writes a
   marker file: `submit` refuses with one line, no job is submitted, the marker never
   appears, mallory's files are left where they are.
2. mallory pre-creates `runs/job-<next ids>` in a shared submit directory (the default run
   directory of `slurm-robust launch`), with the same planted version: robust's batch job
   runs `launch`, which refuses the directory; the planted command never runs as robust,
   and robust writes nothing into mallory's directory.
3. robust's own run directory made group-writable is refused too (with the chmod hint).

Needs the mini-cluster's two users (`cluster up` as root creates them).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "slurm_robust.cli.main"]

#: mallory plants a run directory (or several) with a version that writes a marker.
PLANT_VERSION = textwrap.dedent("""
    import json, os, sys
    marker, python, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    for d in dirs:
        os.makedirs(os.path.join(d, "versions"), exist_ok=True)
        for p in (d, os.path.join(d, "versions")):
            os.chmod(p, 0o777)
        cmd = [python, "-c", f"open({marker!r}, 'w').write('pwned')"]
        record = {"v": 1, "number": 1, "kind": "code", "source": None, "rev": None,
                  "digest": None, "path": None, "command": cmd, "env": {}}
        for name, obj in (("v1.json", record),
                          ("current.json", {"v": 1, "version": 1, "previous": [0],
                                            "staged": None})):
            path = os.path.join(d, "versions", name)
            with open(path, "w") as fh:
                json.dump(obj, fh)
            os.chmod(path, 0o666)
    print(len(dirs))
""")


def _skip_without_users(cfg) -> None:
    for user in (cfg.user, cfg.attacker):
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"no user {user!r} (run `slurm-robust cluster up` as root)")


def _as(user: str, argv: list[str], env: dict[str, str], cwd: str | Path = REPO,
        timeout: float = 120.0) -> subprocess.CompletedProcess:
    keep = [f"{k}={env[k]}" for k in ("SLURM_CONF", "SLURM_ROBUST_CLUSTER_DIR", "PATH")
            if k in env]
    return subprocess.run(["runuser", "-u", user, "--", "env", *keep, *argv], env=env,
                          cwd=str(cwd), capture_output=True, text=True, timeout=timeout)


def _owned_by(root: Path, uid: int) -> list[str]:
    return sorted(str(p) for p in [root, *root.rglob("*")] if p.lstat().st_uid == uid)


def _next_job_id(cluster) -> int:
    out = subprocess.run(["sbatch", "--parsable", "--hold", "-p", "train", "--wrap", "true"],
                         env=cluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = int(out.stdout.strip().split(";")[0])
    subprocess.run(["scancel", str(job)], env=cluster.env, timeout=30)
    return job + 1


def test_submit_refuses_a_run_dir_mallory_pre_created(minicluster):
    cfg = minicluster.cfg
    _skip_without_users(cfg)
    stamp = int(time.time() * 1000)
    run_dir = cfg.shared_dir / f"test-planted-{stamp}"
    marker = cfg.shared_dir / f"sr-pwned-{stamp}"
    plant = _as(cfg.attacker, [sys.executable, "-c", PLANT_VERSION, str(marker),
                               sys.executable, str(run_dir)], minicluster.env)
    assert plant.returncode == 0, plant.stderr
    out = _as(cfg.user, [*CLI, "submit", "--nodes", "1", "--time", "5", "--folder",
                         str(run_dir), "--json", "--", sys.executable, "-c", "pass"],
              minicluster.env)
    assert out.returncode == 1, (out.stdout, out.stderr)
    err = out.stderr.strip()
    assert "Traceback" not in err, err
    # One actionable line: which directory, whose, what to do.
    assert any(": error: " in ln and "refusing it" in ln
               and str(run_dir) in ln for ln in err.splitlines()), err
    assert out.stdout.strip() == ""  # no job id: nothing was submitted
    robust = pwd.getpwnam(cfg.user).pw_uid
    assert _owned_by(run_dir, robust) == []  # robust wrote nothing there
    assert (run_dir / "versions" / "current.json").exists()  # nothing deleted
    assert not marker.exists()


def test_submit_refuses_robusts_own_group_writable_run_dir(minicluster):
    cfg = minicluster.cfg
    _skip_without_users(cfg)
    run_dir = cfg.shared_dir / f"test-groupw-{int(time.time() * 1000)}"
    made = _as(cfg.user, [sys.executable, "-c",
                          f"import os; os.mkdir({str(run_dir)!r}); "
                          f"os.chmod({str(run_dir)!r}, 0o775)"], minicluster.env)
    assert made.returncode == 0, made.stderr
    out = _as(cfg.user, [*CLI, "submit", "--nodes", "1", "--time", "5", "--folder",
                         str(run_dir), "--json", "--", sys.executable, "-c", "pass"],
              minicluster.env)
    assert out.returncode == 1 and "chmod go-w" in out.stderr, out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == []


def test_launch_refuses_a_default_run_dir_mallory_pre_created(minicluster):
    cfg = minicluster.cfg
    _skip_without_users(cfg)
    stamp = int(time.time() * 1000)
    # A submit directory both users can write to (a shared project scratch, say).
    submit_dir = cfg.shared_dir / f"test-squat-{stamp}"
    submit_dir.mkdir()
    submit_dir.chmod(0o1777)
    marker = cfg.shared_dir / f"sr-pwned-{stamp}"
    first = _next_job_id(minicluster)
    squats = [submit_dir / "runs" / f"job-{job}" for job in range(first, first + 4)]
    plant = _as(cfg.attacker, [sys.executable, "-c", PLANT_VERSION, str(marker),
                               sys.executable, *map(str, squats)], minicluster.env)
    assert plant.returncode == 0, plant.stderr
    script = submit_dir / "job.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash", "#SBATCH -N 1", "#SBATCH -t 5", "#SBATCH -p train",
        f"{sys.executable} -m slurm_robust.cli.main launch --spares 0 -- "
        f"{sys.executable} -c pass", ""]))
    script.chmod(0o755)
    out = _as(cfg.user, ["sbatch", "--parsable", "-o", str(submit_dir / "job-%j.out"),
                         str(script)], minicluster.env, cwd=submit_dir)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        assert int(job) in range(first, first + 4), f"job {job} outside the guessed ids"
        log = submit_dir / f"job-{job}.out"
        deadline = time.time() + 120
        while time.time() < deadline:
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"],
                                   env=minicluster.env, capture_output=True, text=True,
                                   timeout=30).stdout.strip()
            if not state and log.exists():
                break
            time.sleep(1)
        text = log.read_text() if log.exists() else ""
    finally:
        subprocess.run(["scancel", job], env=minicluster.env, timeout=30)
    squat = submit_dir / "runs" / f"job-{job}"
    assert "owned by uid" in text and str(squat) in text, text[-2000:]
    robust = pwd.getpwnam(cfg.user).pw_uid
    assert _owned_by(squat, robust) == []  # no config, no state, no events of robust's
    assert not (squat / "agents").exists()
    assert not marker.exists(), "mallory's planted version ran as robust"
    assert os.stat(squat).st_uid == pwd.getpwnam(cfg.attacker).pw_uid  # left in place
