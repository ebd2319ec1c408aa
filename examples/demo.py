"""`make demo`: a robust training on the mini-cluster with a scripted fault schedule.

1. brings the mini-cluster up (idempotent);
2. submits examples/train_gpt.py on NODES nodes + 1 spare through `slurm-robust submit`;
3. injects faults at chosen steps with `slurm-robust inject` (real signals, a real slurmd
   killed), showing a live progress line;
4. prints the incidents and recoveries, and checks that the final parameters are
   bit-identical to a fault-free run (the same example run standalone);
5. returns any node it killed to service.

    python examples/demo.py [--nodes 3] [--steps 80] [--schedule 15:kill-worker,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "slurm_robust.cli.main"]
DEFAULT_SCHEDULE = "15:kill-worker,30:nan,45:kill-node,60:stop-worker"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=3,
                   help="worker nodes (+1 spare); 3 fills the 4-node train partition")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--schedule", default=DEFAULT_SCHEDULE,
                   help="comma-separated STEP:FAULT (kill-worker, stop-worker, nan, "
                        "kill-node, slow-worker)")
    p.add_argument("--no-verify", action="store_true", help="skip the fault-free comparison")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from slurm_robust.launcher.submit.status import format_status, run_status
    from slurm_robust_rehearsal.cluster.config import ClusterConfig
    from slurm_robust_rehearsal.cluster.manager import MiniCluster, choose_network
    from slurm_robust_rehearsal.inject.job import revive_node

    print("bringing the mini-cluster up ...", flush=True)
    cfg, notice = choose_network(ClusterConfig())
    if notice:
        print(notice, flush=True)
    mc = MiniCluster(cfg)
    mc.up()
    env = dict(os.environ, **mc.cfg.env())
    schedule = sorted((int(s), f) for s, f in (item.split(":") for item in
                                                args.schedule.split(",") if item))
    train = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--steps",
             str(args.steps), "--min-step-time", "0.2"]
    run_dir = str(mc.cfg.shared_dir / f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    out = subprocess.run([*CLI, "submit", "--nodes", str(args.nodes), "--spares", "1",
                          "--time", "20", "--folder", run_dir, "--hang-timeout", "8",
                          "--json", "--", *train], env=env, capture_output=True, text=True,
                         check=False, cwd=REPO)
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return 1
    job = json.loads(out.stdout)["job_id"]
    print(f"job {job}: {args.nodes} nodes + 1 spare, run dir {run_dir}")
    print(f"fault schedule: {', '.join(f'{f} at step {s}' for s, f in schedule)}")
    killed: list[str] = []
    try:
        status = follow(run_dir, job, schedule, env, killed, run_status)
    finally:
        for node in killed:
            revive_node(node)
    print("\n" + format_status(status))
    post_mortem(run_dir, env)
    node_lifecycle(job, killed, env)
    if not args.no_verify and status.get("params_sha256"):
        ref = fault_free_digest(args.nodes, train[1:])
        same = ref == status["params_sha256"]
        print(f"fault-free run digest {ref[:16]}...: "
              f"{'IDENTICAL' if same else 'DIFFERENT'} final parameters")
        return 0 if same and status["status"] == "completed" else 1
    return 0 if status.get("status") == "completed" else 1


def follow(run_dir: str, job: str, schedule: list[tuple[int, str]], env: dict[str, str],
           killed: list[str], run_status) -> dict:
    pending = list(schedule)
    status: dict = {}
    while True:
        status = run_status(run_dir)
        step = status.get("step") or 0
        if pending and step >= pending[0][0] and not status.get("open_incident"):
            at, fault = pending.pop(0)
            record = inject(job, fault, run_dir, env)
            if fault == "kill-node" and record:
                killed.append(record["node"])
            if record:
                rank = f", rank {record['rank']}" if "rank" in record else ""
                print(f"\n>>> step {step}: injected {fault} ({record['node']}{rank})")
        line = (f"step {step:>4}  loss {status.get('loss') or 0:7.4f}  attempt "
                f"{status.get('attempt') or 0}  incidents {len(status.get('incidents') or [])}"
                f"  {'RECOVERING' if status.get('open_incident') else status.get('status')}")
        print("\r" + line.ljust(78), end="", flush=True)
        if status.get("status") in ("completed", "stopped", "failed"):
            return status
        time.sleep(0.5)


def inject(job: str, fault: str, run_dir: str, env: dict[str, str]) -> dict:
    extra: list[str] = []
    if fault == "kill-node":
        from slurm_robust.launcher.control.state import load_state
        from slurm_robust.launcher.paths import RunPaths

        controller = json.loads(RunPaths.of(run_dir).controller.read_text())["node"]
        slots = load_state(RunPaths.of(run_dir).state).slots
        extra = ["--node", next(n for n in reversed(slots) if n != controller)]
    out = subprocess.run([*CLI, "inject", fault, "--job", job, "--json", *extra], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"\ninjection of {fault} failed: {out.stderr.strip()}")
        return {}
    return json.loads(out.stdout)


def node_lifecycle(job: str, killed: list[str], env: dict[str, str]) -> None:
    """After the job ends, EpilogSlurmctld applies its verdicts: show the blamed nodes
    drained with their reasons, then run the deep check that returns them to service."""
    from slurm_robust.slurm import Slurm

    slurm = Slurm({k: env[k] for k in ("SLURM_CONF",)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        j = slurm.job(job)
        if j is None or j.finished:
            break
        time.sleep(0.5)
    time.sleep(1.0)  # EpilogSlurmctld runs as the job completes
    for node in killed:
        info = slurm.node(node)
        state = f"drained: {info.reason}" if info.drained else f"{info.state}"
        print(f"node {node} after the job: {state}")
        if info.drained:
            out = subprocess.run([*CLI, "node", "resume", node], env=env, capture_output=True,
                                 text=True, check=False)
            last = (out.stdout.strip().splitlines() or [out.stderr.strip()])[-1]
            print(f"  slurm-robust node resume {node}: {last}")


def post_mortem(run_dir: str, env: dict[str, str]) -> None:
    """Write the run's post-mortem report and print its headline figures."""
    out_dir = str(Path(run_dir) / "report")
    out = subprocess.run([*CLI, "report", run_dir, "-o", out_dir, "--json"], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"post-mortem report failed: {out.stderr.strip()}")
        return
    print(f"post-mortem: {out_dir}/report.html (and report.md)")
    head = json.loads(out.stdout)
    keys = ("ettr", "incidents", "by_class", "by_rung", "mean_time_to_detect_s",
            "mean_time_to_recover_s", "steps_redone")
    print(json.dumps({k: head.get(k) for k in keys}, indent=1, default=str))


def fault_free_digest(world: int, train_args: list[str]) -> str:
    """The same training, standalone (torchrun-style environment), without faults."""
    print("computing the fault-free digest (standalone run) ...", flush=True)
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="29690")
        procs.append(subprocess.Popen([sys.executable, *train_args[:3]], env=env,
                                      stdout=subprocess.PIPE, text=True))
    outs = [p.communicate()[0] for p in procs]
    line = next(ln for ln in outs[0].splitlines() if ln.startswith("params_sha256="))
    return line.split("=")[1].split()[0]


if __name__ == "__main__":
    raise SystemExit(main())
