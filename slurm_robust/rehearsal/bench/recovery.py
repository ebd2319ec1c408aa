"""``slurm-robust bench recovery``: a killed worker, robust launcher vs its peers.

Both runs train examples/train_gpt.py on the mini-cluster (CPU, gloo, 0.2 s steps) and
lose one worker to SIGKILL after step ``--fault-step``:

- **plain**: ``sbatch --requeue``; ``srun --kill-on-bad-exit`` runs the example standalone,
  which ``torch.save``s every ``--save-every`` steps; when the step fails, the batch
  script requeues its own job (``scontrol requeue``), as users of plain Slurm do, and the
  requeued job reloads the last ``torch.save``. The wait includes Slurm's hold of a
  requeued job (BeginTime = cred_expire: 20 s on the mini-cluster, 120 s by default);
- **torchrun**: ``sbatch`` + ``srun torchrun --max-restarts=3`` (c10d rendezvous, one
  agent per node), the example saving with DCP ``async_save`` every ``--save-every``
  steps; the elastic agents restart every worker in the job, which reload the newest
  DCP checkpoint (in-job restart, state from disk);
- **robust**: ``slurm-robust submit --nodes N --spares 1`` and
  ``slurm-robust inject kill-worker``: in-place restart from the shared-memory snapshot.

Measured for each: fault to the next finished step, steps redone, whole-run wall time,
and the final parameters' digest (the two must agree: same training, same data).
With ``--rounds R`` both runs repeat R times in a seeded shuffled order per round
(:mod:`slurm_robust.rehearsal.bench.abtest`), and every figure is given as median, IQR
and min..max over the rounds. The plain run on a stock cluster is *computed*, not run:
its measured time with the mini-cluster's hold replaced by Slurm's default
cred_expire (120 s), because a real 120 s hold per round does not fit the cluster time.
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
from slurm_robust.rehearsal.bench.polling import wait_for
from slurm_robust.slurm import Slurm

HELP = ("recovery from a killed worker: robust launcher vs torchrun+DCP and plain Slurm "
        "--requeue + torch.save")
REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "train_gpt.py"
TORCHRUN_MAX_RESTARTS = 3
#: The torchrun arms' environment. With its default (one rendezvous TCPStore shared by
#: every round) the workers of a restarted round find the previous round's keys; the
#: example then keyed its group by TORCHELASTIC_RESTART_COUNT, which the agents do not
#: agree on (the one whose worker failed counts the restart, the others 0): the new group
#: never formed (2 of 3 bench recovery runs, and the ETTR peer after its 4th restart).
#: A store per round is torchrun's own option for this.
TORCHRUN_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
DEFAULT_CRED_EXPIRE_S = 120  # slurm.conf AuthInfo cred_expire when unset
# Peers the issue asks for that this benchmark does not run yet, and what stops them.
NOT_MEASURED = {
    "nvidia_resiliency_ext_ft_launcher": "unavailable: 0.4.1 (cp311 wheel) downloads, but "
    "ft_launcher needs the worker to report heartbeats through its client API and it "
    "pulls pynvml/nvidia-ml-py; not wired into the example worker",
    "torchft": "unavailable: 0.2.0 (cp311 wheel) downloads, but it needs a lighthouse "
    "server and a training loop built on its Manager/ProcessGroup wrappers; not wired",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="worker nodes (default 3)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-step", type=int, default=15,
                        help="kill a worker once this step has finished")
    parser.add_argument("--save-every", type=int, default=10,
                        help="plain run: torch.save every N steps")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat both runs, interleaved (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")


def run(args: argparse.Namespace) -> dict[str, Any]:

    cfg = ClusterConfig()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up")
    from slurm_robust.rehearsal.bench.abtest import round_order, spread

    if args.rounds < 1:
        raise SlurmRobustError(f"--rounds must be >= 1, got {args.rounds}")
    train = ["--steps", str(args.steps), "--min-step-time", "0.2"]
    hold = _cred_expire(cfg)
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "torchrun": [], "robust": []}
    for rnd in range(args.rounds):
        for arm in round_order(list(runs), rnd, args.seed):
            try:
                runs[arm].append(_robust_run(cfg, args, train) if arm == "robust"
                                 else _plain_run(slurm, cfg, args, train, arm == "torchrun"))
            except SlurmRobustError as exc:
                # A run that never recovers (e.g. an elastic restart stuck in rendezvous)
                # is a result, not a crash of the benchmark.
                runs[arm].append({"error": str(exc)})
    failed = {arm: [i for i, r in enumerate(rs) if "error" in r] for arm, rs in runs.items()}
    good = [i for i in range(args.rounds) if not any(i in f for f in failed.values())]
    all_runs, runs = runs, {arm: [rs[i] for i in good] for arm, rs in runs.items()}
    if not good:
        return {"benchmark": "recovery", "rounds": args.rounds, "failed_rounds": failed,
                "runs": all_runs, "targets": {"met": False}}
    plain_s = [r["fault_to_next_step_s"] for r in runs["plain"]]
    robust_s = [r["fault_to_next_step_s"] for r in runs["robust"]]
    # The same measured run under Slurm's default hold instead of the mini-cluster's.
    stock_s = [p + DEFAULT_CRED_EXPIRE_S - (hold or 0) for p in plain_s]
    torchrun_s = [r["fault_to_next_step_s"] for r in runs["torchrun"]]
    speed_torchrun = [t / r for t, r in zip(torchrun_s, robust_s, strict=True) if r > 0]
    speed_mini = [p / r for p, r in zip(plain_s, robust_s, strict=True) if r > 0]
    speed_stock = [p / r for p, r in zip(stock_s, robust_s, strict=True) if r > 0]
    redone = [r["steps_redone"] for r in runs["robust"]]
    same = [p["params_sha256"] == r["params_sha256"] == t["params_sha256"]
            and p["params_sha256"] is not None
            for p, t, r in zip(runs["plain"], runs["torchrun"], runs["robust"], strict=True)]
    return {"benchmark": "recovery", "nodes": args.nodes, "steps": args.steps,
            "rounds": args.rounds,
            "fault": f"SIGKILL of one worker after step {args.fault_step}",
            "rounds_counted": len(good), "failed_rounds": failed,
            "plain_slurm_requeue_torch_save": all_runs["plain"],
            "torchrun_max_restarts_dcp_async_save": all_runs["torchrun"],
            "slurm_robust": all_runs["robust"],
            "fault_to_next_step_s": {
                "slurm_robust": spread(robust_s),
                "torchrun_max_restarts_dcp_async_save": spread(torchrun_s),
                f"plain_requeue_hold_{hold}s_measured": spread(plain_s),
                f"plain_requeue_hold_{DEFAULT_CRED_EXPIRE_S}s_computed": spread(stock_s)},
            "speedup_fault_to_next_step": {
                "vs_torchrun_dcp": spread(speed_torchrun) if speed_torchrun else None,
                "vs_plain_mini_cluster_hold": spread(speed_mini) if speed_mini else None,
                "vs_plain_default_hold_computed": spread(speed_stock) if speed_stock else None},
            "steps_redone": {"slurm_robust": spread(redone),
                             "torchrun": spread([r["steps_redone"] for r in runs["torchrun"]]),
                             "plain": spread([r["steps_redone"] for r in runs["plain"]])},
            "same_final_params": all(same),
            "requeue_hold_s": hold,
            "targets": {
                "speedup_ge_10x_vs_each_restart_from_disk_peer": bool(
                    speed_mini and speed_torchrun and min(speed_mini) >= 10
                    and min(speed_stock) >= 10 and min(speed_torchrun) >= 10),
                "no_step_redone": max(redone) == 0,
                "same_final_params": all(same)},
            "not_measured": NOT_MEASURED,
            "note": f"plain Slurm holds a requeued job for cred_expire seconds (default "
                    f"{DEFAULT_CRED_EXPIRE_S}; the mini-cluster sets {hold}); the default-"
                    "hold figures are the measured ones with that difference added"}


def _plain_run(slurm: Any, cfg: Any, args: argparse.Namespace,
               train: list[str], torchrun: bool = False) -> dict[str, Any]:
    kind = "torchrun" if torchrun else "plain"
    run_dir = cfg.shared_dir / f"bench-{kind}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True)
    progress = run_dir / "progress.txt"
    marker = str(run_dir / "ckpt")
    worker = [sys.executable, str(EXAMPLE), *train, "--save-every", str(args.save_every),
              "--ckpt-dir", marker, "--progress-file", str(progress)]
    port = 40000 + os.getpid() % 1000 + (500 if torchrun else 0)  # clear of the launcher's
    if torchrun:
        script = torchrun_script(args.nodes, TORCHRUN_MAX_RESTARTS, port, "bench",
                                 [*worker[1:], "--ckpt-format", "dcp_async"])
    else:
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
                        "--requeue", "-J", f"bench-{kind}", "-o", str(run_dir / "slurm-%j.out")],
                       script=script)
    try:
        last = wait_for(lambda: _max_step(progress) >= args.fault_step, args.timeout,
                        "plain run to reach the fault step")
        pid = _find_worker(marker, rank=str(args.nodes - 1))
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        last = _max_step(progress)
        nxt = wait_for(lambda: _first_after(progress, fault_t), args.timeout,
                       "plain run to finish a step after the fault")
        wait_for(lambda: (j := slurm.job(job)) is not None and j.finished, args.timeout,
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


def torchrun_script(nodes: int, max_restarts: int, port: int, rdzv_prefix: str,
                    worker: list[str]) -> str:
    """The batch script of a torchrun arm: one elastic agent per node (it takes the
    script, not the interpreter) with c10d rendezvous on ``port``; a dead worker makes
    every agent restart its worker in a new round, and the example reloads the newest
    DCP checkpoint. ``worker``: the script and its arguments. The agents watch their
    workers at torchrun's default interval (0.1 s), as its users run it."""
    agent = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
             "--nproc-per-node=1", f"--max-restarts={max_restarts}",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
             f"--rdzv-id={rdzv_prefix}$SLURM_JOB_ID"]
    cmd = " ".join(shlex.quote(a) if "$" not in a else a for a in agent) + " " + \
        " ".join(shlex.quote(w) for w in worker)
    return "\n".join(["#!/bin/sh", f"export {TORCHRUN_ENV}",
                      f"srun --kill-on-bad-exit=0 {cmd}"]) + "\n"


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
    wait_for(lambda: (run_status(run_dir).get("step") or 0) >= args.fault_step, args.timeout,
             "robust run to reach the fault step")
    fault_t = time.time()
    inj = subprocess.run([*cli, "inject", "kill-worker", "--job", job, "--rank",
                          str(args.nodes - 1), "--json"], env=env, capture_output=True,
                         text=True, timeout=60)
    if inj.returncode != 0:
        raise SlurmRobustError(f"injection failed: {inj.stderr.strip()}")
    status = wait_for(lambda: (s := run_status(run_dir)).get("status") in
                      ("completed", "stopped", "failed") and s, args.timeout,
                      "robust run end")
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
