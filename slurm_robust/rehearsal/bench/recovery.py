"""``slurm-robust bench recovery``: a killed worker, robust launcher vs plain Slurm.

Both runs train examples/train_gpt.py on the mini-cluster (CPU, gloo, 0.2 s steps) and
lose one worker to SIGKILL after step ``--fault-step``:

- **plain**: ``sbatch --requeue``; ``srun --kill-on-bad-exit`` runs the example standalone,
  which ``torch.save``s every ``--save-every`` steps; when the step fails, the batch
  script requeues its own job (``scontrol requeue``), as users of plain Slurm do, and the
  requeued job reloads the last ``torch.save``. The wait includes Slurm's hold of a
  requeued job (BeginTime = cred_expire: 20 s on the mini-cluster, 120 s by default);
- **robust**: ``slurm-robust submit --nodes N --spares 1`` and
  ``slurm-robust inject kill-worker``: in-place restart from the shared-memory snapshot.

Measured for each: fault to the next finished step, steps redone, whole-run wall time,
and the final parameters' digest (the two must agree: same training, same data).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust.cluster.config import ClusterConfig
from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.records import read_records
from slurm_robust.slurm import Slurm

HELP = "recovery from a killed worker: robust launcher vs plain Slurm --requeue + torch.save"
REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "train_gpt.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="worker nodes (default 3)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-step", type=int, default=15,
                        help="kill a worker once this step has finished")
    parser.add_argument("--save-every", type=int, default=10,
                        help="plain run: torch.save every N steps")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")


def run(args: argparse.Namespace) -> dict[str, Any]:

    cfg = ClusterConfig()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up")
    train = ["--steps", str(args.steps), "--min-step-time", "0.2"]
    plain = _plain_run(slurm, cfg, args, train)
    robust = _robust_run(cfg, args, train)
    return {"benchmark": "recovery", "nodes": args.nodes, "steps": args.steps,
            "fault": f"SIGKILL of one worker after step {args.fault_step}",
            "plain_slurm_requeue_torch_save": plain, "slurm_robust": robust,
            "speedup_fault_to_next_step": _ratio(plain["fault_to_next_step_s"],
                                                 robust["fault_to_next_step_s"]),
            "same_final_params": plain["params_sha256"] == robust["params_sha256"],
            "requeue_hold_s": _cred_expire(cfg),
            "note": "plain Slurm holds a requeued job for cred_expire seconds (default 120; "
                    "the mini-cluster sets 20), so on a stock cluster the plain number "
                    "grows by about 100 s"}


def _plain_run(slurm: Any, cfg: Any, args: argparse.Namespace,
               train: list[str]) -> dict[str, Any]:
    run_dir = cfg.shared_dir / f"bench-plain-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True)
    progress = run_dir / "progress.txt"
    marker = str(run_dir / "ckpt")
    worker = [sys.executable, str(EXAMPLE), *train, "--save-every", str(args.save_every),
              "--ckpt-dir", marker, "--progress-file", str(progress)]
    port = 40000 + os.getpid() % 1000  # clear of the launcher's rendezvous ports
    task = ('RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=0 '
            'exec "$0" "$@"')
    script = "\n".join([
        "#!/bin/sh",
        f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port}",
        f"srun --kill-on-bad-exit=1 sh -c {shlex.quote(task)} "
        + " ".join(shlex.quote(w) for w in worker),
        # What a plain-Slurm user does: a failed step requeues the job.
        'if [ $? -ne 0 ]; then scontrol requeue "$SLURM_JOB_ID"; sleep 60; fi',
    ]) + "\n"
    t0 = time.time()
    job = slurm.sbatch(["-N", str(args.nodes), "--ntasks-per-node=1", "-p", "train",
                        "--requeue", "-J", "bench-plain", "-o", str(run_dir / "slurm-%j.out")],
                       script=script)
    try:
        last = _wait(lambda: _max_step(progress) >= args.fault_step, args.timeout,
                     "plain run to reach the fault step")
        pid = _find_worker(marker, rank=str(args.nodes - 1))
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        last = _max_step(progress)
        nxt = _wait(lambda: _first_after(progress, fault_t), args.timeout,
                    "plain run to finish a step after the fault")
        _wait(lambda: (j := slurm.job(job)) is not None and j.finished, args.timeout,
              "plain run to end")
    finally:
        j = slurm.job(job)
        if j is not None and not j.finished:
            slurm.cancel(job)
    out = (run_dir / f"slurm-{job}.out").read_text(errors="replace")
    sha = next((ln.split("=")[1].split()[0] for ln in out.splitlines()
                if ln.startswith("params_sha256=")), None)
    step, t_next = nxt
    return {"job_id": job, "fault_to_next_step_s": round(t_next - fault_t, 2),
            "last_step_before_fault": last, "resumed_at_step": step - 1,
            "steps_redone": last - (step - 1), "wall_s": round(time.time() - t0, 1),
            "params_sha256": sha, "run_dir": str(run_dir)}


def _robust_run(cfg: Any, args: argparse.Namespace, train: list[str]) -> dict[str, Any]:

    run_dir = str(cfg.shared_dir / f"bench-robust-{int(time.time() * 1000)}")
    cli = [sys.executable, "-m", "slurm_robust.cli.main"]
    env = dict(os.environ, **cfg.env())
    t0 = time.time()
    out = subprocess.run([*cli, "submit", "--nodes", str(args.nodes), "--spares", "1",
                          "--time", "20", "--folder", run_dir, "--json", "--",
                          sys.executable, str(EXAMPLE), *train], env=env, capture_output=True,
                         text=True, timeout=120)
    if out.returncode != 0:
        raise SlurmRobustError(f"robust submit failed: {out.stderr.strip()}")
    job = json.loads(out.stdout)["job_id"]
    _wait(lambda: (run_status(run_dir).get("step") or 0) >= args.fault_step, args.timeout,
          "robust run to reach the fault step")
    fault_t = time.time()
    inj = subprocess.run([*cli, "inject", "kill-worker", "--job", job, "--rank",
                          str(args.nodes - 1), "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    if inj.returncode != 0:
        raise SlurmRobustError(f"injection failed: {inj.stderr.strip()}")
    status = _wait(lambda: (s := run_status(run_dir)).get("status") in
                   ("completed", "stopped", "failed") and s, args.timeout, "robust run end")
    events = read_records(Path(run_dir) / "events.jsonl").records
    incident = next(e for e in events if e.get("event") == "incident")
    # The kill happens inside the inject command, a moment after fault_t; the incident
    # records when the worker really died.
    fault_t = incident.get("fault_time") or fault_t
    t_next = min(e["time"] for e in events
                 if e.get("event") == "step" and e["time"] > fault_t)
    return {"job_id": job, "fault_to_next_step_s": round(t_next - fault_t, 2),
            "incident_class": incident["class"], "rung": incident["rung"],
            "restore_tier": incident["restore_tier"], "steps_redone": incident["steps_lost"],
            "wall_s": round(time.time() - t0, 1), "params_sha256": status.get("params_sha256"),
            "run_dir": run_dir}


def _wait(probe: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise SlurmRobustError(f"timed out after {timeout:g} s waiting for {what}")


def _steps(progress: Path) -> list[tuple[int, float]]:
    try:
        lines = progress.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def _max_step(progress: Path) -> int:
    return max((s for s, _ in _steps(progress)), default=0)


def _first_after(progress: Path, t: float) -> tuple[int, float] | None:
    later = [(s, ts) for s, ts in _steps(progress) if ts > t]
    return min(later, key=lambda x: x[1]) if later else None


def _find_worker(marker: str, rank: str) -> int:
    """The pid of the plain run's worker of ``rank`` (found by its unique checkpoint dir)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd and str(EXAMPLE).encode() in cmd \
                and f"RANK={rank}".encode() in env:
            return int(entry)
    raise SlurmRobustError(f"no worker of rank {rank} found for {marker}")


def _cred_expire(cfg: Any) -> int | None:
    for part in cfg.slurm_conf.read_text().split():
        if "cred_expire=" in part:
            return int(part.split("cred_expire=")[1].split(",")[0])
    return None


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None
