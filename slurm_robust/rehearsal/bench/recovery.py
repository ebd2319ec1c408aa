"""``slurm-robust bench recovery``: a killed worker, robust launcher vs its peers.

Every run trains examples/train_gpt.py on the mini-cluster (CPU, gloo, 0.2 s steps) and
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
- **ft_launcher**: the torchrun arm's job with NVIDIA's ``ft_launcher``
  (nvidia-resiliency-ext, a fork of torchrun's elastic agent with a rank monitor per
  rank) in torchrun's place, the example sending one heartbeat per step through its
  client API (see :func:`ft_launcher_script`); run only where ft_launcher is installed;
- **robust**: ``slurm-robust submit --nodes N --spares 1`` and
  ``slurm-robust inject kill-worker``: in-place restart from the shared-memory snapshot.

Measured for each: fault to the next finished step, steps redone, whole-run wall time,
and the final parameters' digest (all must agree: same training, same data).
With ``--rounds R`` the runs repeat R times in a seeded shuffled order per round
(:mod:`slurm_robust.rehearsal.bench.abtest`), and every figure is given as median, IQR
and min..max over the rounds. The plain run on a stock cluster is *computed*, not run:
its measured time with the mini-cluster's hold replaced by Slurm's default
cred_expire (120 s), because a real 120 s hold per round does not fit the cluster time.
``--arms`` runs a subset (default: every arm available here); an arm not run has null
figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust.cluster.config import ClusterConfig
from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.records import read_records
from slurm_robust.rehearsal.bench.polling import wait_for
from slurm_robust.rehearsal.inject.job import inject as inject_fault
from slurm_robust.slurm import Slurm
from slurm_robust.vocabulary import RUN_STATUSES

HELP = ("recovery from a killed worker: robust launcher vs torchrun+DCP, ft_launcher+DCP "
        "and plain Slurm --requeue + torch.save")
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
ARMS = ("plain", "torchrun", "ft_launcher", "robust")
#: Rendezvous ports of the peers' runs (base + pid % 1000 + offset): apart from each
#: other and clear of the robust launcher's.
PEER_PORT_OFFSET = {"plain": 0, "ft_launcher": 250, "torchrun": 500}
FT_LAUNCHER_KEY = "nvidia_resiliency_ext_ft_launcher"
#: How to make the ft_launcher arm available. A venv of its own, because installing the
#: package into the project's venv pulls pynvml 13, whose import hook then prints a
#: FutureWarning on every ``import torch`` and ``import pynvml`` there.
FT_LAUNCHER_ENABLE = (
    "not installed: python3 -m venv /tmp/ftl-venv && /tmp/ftl-venv/bin/pip install "
    "torch==2.13.0 nvidia-resiliency-ext==0.4.1 -e {repo}, then pass --ft-launcher "
    "/tmp/ftl-venv/bin/ft_launcher (or `.venv/bin/pip install nvidia-resiliency-ext==0.4.1` "
    "to find it next to this interpreter)")
# Peers the issue asks for that this benchmark does not run yet, and what stops them.
NOT_MEASURED = {
    "torchft": "not wired (0.2.0 downloads as a cp311 wheel): it recovers another way. "
    "The replica groups that survive a kill keep stepping in a smaller quorum while the "
    "failed group restarts and copies the live state from a peer (Manager quorum + "
    "checkpoint transport), so there is no job-wide stop to time and the final parameters "
    "differ from a fault-free run's (the steps without that replica); comparing needs a "
    "lighthouse and the example rebuilt on torchft's Manager and DDP/optimizer wrappers",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=3, help="worker nodes (default 3)")
    parser.add_argument("--steps", type=int, default=100,
                        help="training steps per run (default 100)")
    # Five steps after a save (--save-every 10), so the peers redo 5 steps; and in a
    # running job, not one in its first seconds. The agents refill their zygotes (a new
    # interpreter importing torch) once the first workers have stepped; on a loaded
    # 2-core machine that took 8-11 s, and a fault before it waits for the import: after
    # step 35 (7-10 s after the first step) 1 of 3 rounds took 1.3 s instead of about
    # 0.45 s. After step 75 the zygotes were ready in every round.
    parser.add_argument("--fault-step", type=int, default=75,
                        help="kill a worker once this step has finished (default 75)")
    parser.add_argument("--save-every", type=int, default=10,
                        help="plain run: torch.save every N steps")
    parser.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the runs, interleaved (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")
    parser.add_argument("--arms", default=None,
                        help=f"comma list of arms to run, of {','.join(ARMS)} (default: "
                             "all that are available here)")
    parser.add_argument("--ft-launcher", default=None, metavar="PATH",
                        help="ft_launcher executable of nvidia-resiliency-ext (default: the "
                             "one next to this interpreter, else on PATH)")


def find_ft_launcher(path: str | None) -> str | None:
    """ft_launcher's executable: ``path``, else next to this interpreter, else on PATH."""
    if path:
        return path if os.access(path, os.X_OK) else None
    beside = Path(sys.executable).parent / "ft_launcher"
    return str(beside) if os.access(beside, os.X_OK) else shutil.which("ft_launcher")


def select_arms(spec: str | None, ft_launcher: str | None) -> tuple[list[str], dict[str, str]]:
    """The arms to run (in :data:`ARMS` order) and what to say of the peers not measured.

    By default the ft_launcher arm is left out where ft_launcher is not installed; asked
    for by name, it must be there.
    """
    enable = FT_LAUNCHER_ENABLE.format(repo=REPO)
    if spec is None:
        arms = [a for a in ARMS if a != "ft_launcher" or ft_launcher]
        return arms, {} if ft_launcher else {FT_LAUNCHER_KEY: enable}
    asked = [a.strip() for a in spec.split(",") if a.strip()]
    unknown = sorted(set(asked) - set(ARMS))
    if unknown or not asked:
        raise UsageError(f"--arms: unknown or no arm ({', '.join(unknown)}); "
                         f"choose from {','.join(ARMS)}")
    if "ft_launcher" in asked and not ft_launcher:
        raise SlurmRobustError(f"--arms ft_launcher: ft_launcher {enable}")
    not_measured = {} if "ft_launcher" in asked else {FT_LAUNCHER_KEY: "not in --arms"}
    return [a for a in ARMS if a in asked], not_measured


def run(args: argparse.Namespace) -> dict[str, Any]:

    ft_launcher = find_ft_launcher(args.ft_launcher)
    if args.ft_launcher and ft_launcher is None:
        raise UsageError(f"--ft-launcher {args.ft_launcher}: not an executable file")
    arms, not_measured = select_arms(args.arms, ft_launcher)
    cfg = ClusterConfig()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up")
    from slurm_robust.rehearsal.bench.abtest import round_order

    if args.rounds < 1:
        raise SlurmRobustError(f"--rounds must be >= 1, got {args.rounds}")
    train = ["--steps", str(args.steps), "--min-step-time", "0.2"]
    hold = _cred_expire(cfg)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rnd in range(args.rounds):
        for arm in round_order(arms, rnd, args.seed):
            try:
                runs[arm].append(_robust_run(cfg, args, train) if arm == "robust"
                                 else _peer_run(slurm, cfg, args, train, arm, ft_launcher))
            except SlurmRobustError as exc:
                # A run that never recovers (e.g. an elastic restart stuck in rendezvous)
                # is a result, not a crash of the benchmark.
                runs[arm].append({"error": str(exc)})
    failed = {arm: [i for i, r in enumerate(runs[arm]) if "error" in r] for arm in arms}
    good = [i for i in range(args.rounds) if not any(i in f for f in failed.values())]
    if not good:
        return {"benchmark": "recovery", "rounds": args.rounds, "arms": arms,
                "failed_rounds": failed, "runs": runs, "targets": {"met": False}}
    counted = {arm: [rs[i] for i in good] for arm, rs in runs.items() if arm in arms}
    return {"benchmark": "recovery", "nodes": args.nodes, "steps": args.steps,
            "rounds": args.rounds, "arms": arms,
            "fault": f"SIGKILL of one worker after step {args.fault_step}",
            "rounds_counted": len(good), "failed_rounds": failed,
            "plain_slurm_requeue_torch_save": runs["plain"],
            "torchrun_max_restarts_dcp_async_save": runs["torchrun"],
            "ft_launcher_max_restarts_dcp_async_save": runs["ft_launcher"],
            "slurm_robust": runs["robust"],
            **summarise(counted, hold),
            "requeue_hold_s": hold,
            "not_measured": {**not_measured, **NOT_MEASURED},
            "note": f"plain Slurm holds a requeued job for cred_expire seconds (default "
                    f"{DEFAULT_CRED_EXPIRE_S}; the mini-cluster sets {hold}); the default-"
                    "hold figures are the measured ones with that difference added"}


def summarise(runs: dict[str, list[dict[str, Any]]], hold: int | None) -> dict[str, Any]:
    """Spreads, speedups and targets of the rounds every arm run finished.

    ``runs``: arm -> its counted rounds, only for the arms that ran. An arm not run has
    null figures; the 10x target is over the restart-from-disk peers that ran (and needs
    the robust arm and at least one of them).
    """
    from slurm_robust.rehearsal.bench.abtest import spread

    def fig(values: list[float] | None) -> dict[str, Any] | None:
        return spread(values) if values else None

    # Each arm's fault-to-next-step seconds per counted round; None for an arm not run.
    secs: dict[str, list[float] | None] = {
        arm: [r["fault_to_next_step_s"] for r in runs[arm]] if arm in runs else None
        for arm in ARMS}
    robust_s, plain_s = secs["robust"], secs["plain"]
    # The same measured run under Slurm's default hold instead of the mini-cluster's.
    stock_s = ([p + DEFAULT_CRED_EXPIRE_S - (hold or 0) for p in plain_s]
               if plain_s is not None else None)

    def speedup(peer: list[float] | None) -> list[float] | None:
        if peer is None or robust_s is None:
            return None
        return [p / r for p, r in zip(peer, robust_s, strict=True) if r > 0]

    speeds = {"vs_torchrun_dcp": speedup(secs["torchrun"]),
              "vs_ft_launcher": speedup(secs["ft_launcher"]),
              "vs_plain_mini_cluster_hold": speedup(plain_s),
              "vs_plain_default_hold_computed": speedup(stock_s)}
    measured = [v for v in speeds.values() if v is not None]
    redone = {arm: fig([r["steps_redone"] for r in runs[arm]]) if arm in runs else None
              for arm in ARMS}
    digests = [{r["params_sha256"] for r in rounds} for rounds in zip(*runs.values(), strict=True)]
    same = all(len(d) == 1 and None not in d for d in digests)
    robust_redone = [r["steps_redone"] for r in runs.get("robust", [])]
    return {
        "fault_to_next_step_s": {
            "slurm_robust": fig(robust_s),
            "torchrun_max_restarts_dcp_async_save": fig(secs["torchrun"]),
            "ft_launcher_max_restarts_dcp_async_save": fig(secs["ft_launcher"]),
            f"plain_requeue_hold_{hold}s_measured": fig(plain_s),
            f"plain_requeue_hold_{DEFAULT_CRED_EXPIRE_S}s_computed": fig(stock_s)},
        "speedup_fault_to_next_step": {k: fig(v) for k, v in speeds.items()},
        "steps_redone": {"slurm_robust": redone["robust"], "torchrun": redone["torchrun"],
                         "ft_launcher": redone["ft_launcher"], "plain": redone["plain"]},
        "same_final_params": same,
        "targets": {
            "speedup_ge_10x_vs_each_restart_from_disk_peer": bool(
                measured and all(v and min(v) >= 10 for v in measured)),
            "no_step_redone": max(robust_redone) == 0 if robust_redone else None,
            "same_final_params": same}}


def _peer_run(slurm: Any, cfg: Any, args: argparse.Namespace, train: list[str],
              kind: str, ft_launcher: str | None = None) -> dict[str, Any]:
    """One run of a restart-from-disk peer: ``kind`` is plain, torchrun or ft_launcher."""
    run_dir = cfg.shared_dir / f"bench-{kind}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True)
    progress = run_dir / "progress.txt"
    marker = str(run_dir / "ckpt")
    worker = [sys.executable, str(EXAMPLE), *train, "--save-every", str(args.save_every),
              "--ckpt-dir", marker, "--progress-file", str(progress)]
    port = 40000 + os.getpid() % 1000 + PEER_PORT_OFFSET[kind]
    # The elastic agents take the script, not the interpreter; their workers save with DCP.
    elastic_worker = [*worker[1:], "--ckpt-format", "dcp_async"]
    if kind == "torchrun":
        script = torchrun_script(args.nodes, TORCHRUN_MAX_RESTARTS, port, "bench",
                                 elastic_worker)
    elif kind == "ft_launcher":
        assert ft_launcher is not None  # select_arms only picks the arm when it is found
        script = ft_launcher_script(ft_launcher, args.nodes, TORCHRUN_MAX_RESTARTS, port,
                                    "bench-ftl", elastic_worker)
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
        last = _max_step(progress)
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        # The step in flight at the kill can still be logged after it (its all-reduce
        # had finished): not a recovery. A kill between saves makes the restarted run
        # redo steps, so its first step is one at or below the last one before the kill.
        redo = args.fault_step % args.save_every != 0
        nxt = wait_for(lambda: _first_after(progress, fault_t, last if redo else None),
                       args.timeout, "plain run to finish a step after the fault")
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
    agent = [sys.executable, "-m", "torch.distributed.run",
             *_elastic_args(nodes, max_restarts, port, rdzv_prefix)]
    return _agent_script(agent, f"export {TORCHRUN_ENV}", worker)


def ft_launcher_script(launcher: str, nodes: int, max_restarts: int, port: int,
                       rdzv_prefix: str, worker: list[str]) -> str:
    """The batch script of the ft_launcher arm: :func:`torchrun_script` with
    nvidia-resiliency-ext's ``ft_launcher`` (the executable ``launcher``) for torchrun.

    The options set are torchrun's arm's own (nodes, one worker per node, max restarts,
    c10d rendezvous on ``port``); everything else is ft_launcher's default, as its users
    run it: 0.1 s monitor interval (the agent, not a heartbeat timeout, sees the killed
    worker exit), restart policy any-failed, 30 s workers-stop timeout, heartbeat
    timeouts of 1 h / 45 min, the GPU and NIC health checks (they switch themselves off
    without NVML). TORCH_DISABLE_SHARE_RDZV_TCP_STORE does not apply: ft_launcher runs its
    own copy of torch 2.3's agent, which never shares the rendezvous store with the
    workers (rank 0's agent picks a free MASTER_PORT each round). ft_launcher starts the
    workers with its own interpreter, which must import slurm_robust and
    nvidia_resiliency_ext (the example then sends a heartbeat per step).
    """
    agent = [launcher, *_elastic_args(nodes, max_restarts, port, rdzv_prefix)]
    return _agent_script(agent, None, worker)


def _elastic_args(nodes: int, max_restarts: int, port: int, rdzv_prefix: str) -> list[str]:
    return [f"--nnodes={nodes}", "--nproc-per-node=1", f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=$RDZV_HOST:{port}",
            f"--rdzv-id={rdzv_prefix}$SLURM_JOB_ID"]


#: The rendezvous host: the address Slurm reaches the allocation's first node at, as a
#: multi-node torchrun job script finds its master (127.0.0.1 on the shared-network
#: mini-cluster, the node's own address when each node has its network namespace).
RDZV_HOST = ('export RDZV_HOST=$(scontrol show node "$(scontrol show hostnames '
             '"$SLURM_JOB_NODELIST" | head -n 1)" | tr " " "\\n" | '
             "sed -n 's/^NodeAddr=//p')")
#: Each agent's own address (``--local-addr``): torchrun hands rank 0's to the workers as
#: MASTER_ADDR, and its default, the host name, is the host's address in every node's
#: network namespace, where the workers' group could not form.
LOCAL_ADDR = ('--local-addr="$(scontrol show node "$SLURMD_NODENAME" | tr " " "\\n" | '
              "sed -n 's/^NodeAddr=//p')\"")


def _agent_script(agent: list[str], export: str | None, worker: list[str]) -> str:
    """``srun`` of one elastic agent per node, each through ``sh -c`` to find its own
    address; ``$``-words are left for the shells."""
    inner = " ".join(a if "$" in a else shlex.quote(a) for a in agent) + " " + LOCAL_ADDR \
        + " " + " ".join(shlex.quote(w) for w in worker)
    head = ["#!/bin/sh", *([export] if export else []), RDZV_HOST]
    return "\n".join([*head, f"srun --kill-on-bad-exit=0 sh -c {shlex.quote('exec ' + inner)}"]) \
        + "\n"


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
    try:
        wait_for(lambda: (run_status(run_dir).get("step") or 0) >= args.fault_step,
                 args.timeout, "robust run to reach the fault step")
    except SlurmRobustError as exc:
        # A job that never started says why (a drained node left the 3 + 1 short, ...).
        slurm = Slurm(cfg.env())
        j = slurm.job(job)
        if j is not None and not j.finished:
            slurm.cancel(job)  # as the peers' runs are: the next round needs the nodes
        if j is not None and j.state == "PENDING":
            raise SlurmRobustError(f"{exc}: job {job} still PENDING ({j.state_reason}); "
                                   "see `sinfo -R`") from exc
        raise
    # In this process, as the peers' kill is (`slurm-robust inject kill-worker` is the
    # same function behind a new interpreter, whose start-up would compete with the
    # restart on a small machine). The clock starts just before the kill (the record's
    # time), as the peers' does, so the agent's detection is inside the figure.
    record = inject_fault("kill-worker", job, rank=args.nodes - 1, run_dir=run_dir)
    fault_t = float(record["time"])
    status = wait_for(lambda: (s := run_status(run_dir)).get("status") in
                      RUN_STATUSES and s, args.timeout,
                      "robust run end")
    events = read_records(Path(run_dir) / "events.jsonl").records
    incident = next(e for e in events if e.get("event") == "incident")
    # The restarted generation's first step (a step in flight at the kill is not one).
    t_next = min(e["time"] for e in events
                 if e.get("event") == "step" and e["time"] > fault_t
                 and (e.get("attempt") or 0) >= (incident.get("attempt") or 0))
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


def _first_after(progress: Path, t: float,
                 at_most: int | None = None) -> tuple[int, float] | None:
    later = [(s, ts) for s, ts in _steps(progress)
             if ts > t and (at_most is None or s <= at_most)]
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
