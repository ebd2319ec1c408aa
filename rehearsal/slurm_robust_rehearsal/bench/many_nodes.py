"""``slurm-robust bench many-nodes``: one job across many mini-cluster nodes, two faults.

The rehearsal the other benchmarks are too small for: one robust run of the example over
``--nodes`` worker nodes plus ``--spares`` in-job spares (``cluster up --nodes 18`` for the
default 16 + 2), a SIGKILLed worker (the in-place rung), then a lost node (its slurmd and
every process of the job on it killed, its node-local copies wiped: the spare rung, the
lost rank restored from its peer backup). The run must end with the same parameters as the
fault-free run of the same script standalone on this host (same ranks, no Slurm).

Reported: the start-up (submit to the first step), the mean step time, each incident's
class, rung, restore tier, steps redone and its times from the fault (detected, recovered,
the next step), and whether the digests agree. Every node is a real slurmd on this host,
so the figures also measure a small machine hosting many nodes' processes: the step time
says how loaded it was.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.records import read_records
from slurm_robust.slurm import Slurm
from slurm_robust.vocabulary import RUN_STATUSES
from slurm_robust_rehearsal.bench.arms.base import EXAMPLE
from slurm_robust_rehearsal.bench.arms.robust import submit_example
from slurm_robust_rehearsal.bench.polling import wait_for
from slurm_robust_rehearsal.bench.reference import standalone_params_digest
from slurm_robust_rehearsal.cluster.config import ClusterConfig

HELP = "one robust job across many mini-cluster nodes: a killed worker, a lost node"
#: What a recovered fault must take at most, from the fault to the restored state.
TARGET_RECOVERED_S = 20.0
#: Variables of this process the standalone reference's ranks must not inherit.
REFERENCE_DROP_ENV = ("SLURM_ROBUST_PROGRESS", "SLURM_ROBUST_RUN_DIR")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=16, help="worker nodes (default 16)")
    parser.add_argument("--spares", type=int, default=2,
                        help="in-job spare nodes (default 2)")
    parser.add_argument("--steps", type=int, default=120, help="training steps (default 120)")
    parser.add_argument("--min-step-time", type=float, default=0.3,
                        help="seconds a step takes at least (default 0.3)")
    parser.add_argument("--kill-worker-step", type=int, default=30,
                        help="SIGKILL the highest rank once this step is done (default 30)")
    parser.add_argument("--kill-node-step", type=int, default=70,
                        help="lose a node once this step is done, after the first "
                             "recovery (default 70)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds for the whole run (default 900)")


def _check(args: argparse.Namespace, slurm: Slurm) -> None:
    if args.nodes < 3 or args.spares < 1:
        raise UsageError("--nodes must be >= 3 and --spares >= 1 (a node is lost to a spare; "
                         "the controller's node and the batch node are not the victim)")
    if not 0 < args.kill_worker_step < args.kill_node_step < args.steps:
        raise UsageError(f"need 0 < --kill-worker-step ({args.kill_worker_step}) < "
                         f"--kill-node-step ({args.kill_node_step}) < --steps ({args.steps})")
    want = args.nodes + args.spares
    idle = [n for n in slurm.nodes() if "train" in n.partitions and n.idle]
    if len(idle) < want:
        raise UsageError(f"{want} idle nodes needed in the train partition, {len(idle)} "
                         f"there: slurm-robust cluster down && slurm-robust cluster up "
                         f"--nodes {want}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from slurm_robust_rehearsal.inject.job import inject, revive_node, spare_path_victim

    cfg = ClusterConfig()
    slurm = Slurm(cfg.env())
    if not slurm.ping():
        raise SlurmRobustError("the mini-cluster is not running: slurm-robust cluster up "
                               f"--nodes {args.nodes + args.spares}")
    _check(args, slurm)
    train = ["--steps", str(args.steps), "--min-step-time", str(args.min_step_time)]
    t_ref = time.time()
    reference = standalone_params_digest([sys.executable, str(EXAMPLE), *train], args.nodes,
                                         timeout_s=args.timeout, drop_env=REFERENCE_DROP_ENV)
    reference_s = time.time() - t_ref
    run_dir = str(cfg.shared_dir / f"bench-many-nodes-{int(time.time() * 1000)}")
    paths = RunPaths.of(run_dir)
    deadline = time.monotonic() + args.timeout
    t0 = time.time()
    job = submit_example(cfg.env(), args.nodes, args.spares, run_dir, train)
    killed: list[str] = []
    try:
        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        def reached(step: int) -> bool:
            return (run_status(run_dir).get("step") or 0) >= step

        wait_for(lambda: reached(args.kill_worker_step), left(),
                 f"step {args.kill_worker_step}")
        faults = [inject("kill-worker", job, run_dir=run_dir)]
        wait_for(lambda: (inc := _incidents(paths)) and inc[-1].get("recovered_at")
                 and reached(args.kill_node_step), left(),
                 f"the first recovery and step {args.kill_node_step}")
        state = load_state(paths.state)
        controller = json.loads(paths.controller.read_text())["node"]
        victim = spare_path_victim(state, controller)
        killed.append(victim)
        faults.append(inject("kill-node", job, node=victim, run_dir=run_dir))
        status = wait_for(lambda: (s := run_status(run_dir)).get("status") in RUN_STATUSES
                          and s, left(), "the run's end")
    except SlurmRobustError:
        slurm.cancel(job)
        raise
    finally:
        # The lost node's verdict drains it when the job ends (EpilogSlurmctld): it is
        # returned to service after that, so that the next rehearsal finds every node.
        _wait_job_gone(slurm, job)
        for node in killed:
            revive_node(node)
    wall = time.time() - t0
    return _report(args, paths, job, faults, status, reference, reference_s, t0, wall)


def _wait_job_gone(slurm: Slurm, job: str, timeout_s: float = 120.0) -> None:
    """Until Slurm has ended ``job`` (best effort: a slow epilog only delays the revival)."""
    try:
        wait_for(lambda: (j := slurm.job(job)) is None or j.finished, timeout_s,
                 f"job {job} to end", every_s=1.0)
    except SlurmRobustError:
        pass


def _incidents(paths: RunPaths) -> list[dict[str, Any]]:
    return [e for e in read_records(paths.events).records if e.get("event") == "incident"]


def _report(args: argparse.Namespace, paths: RunPaths, job: str,
            faults: list[dict[str, Any]], status: dict[str, Any], reference: str,
            reference_s: float, t0: float, wall: float) -> dict[str, Any]:
    events = read_records(paths.events).records
    steps = [e for e in events if e.get("event") == "step"]
    incidents = _incidents(paths)
    rows = []
    for fault, inc in zip(faults, incidents, strict=False):
        at = float(fault["time"])
        after = [e["time"] for e in steps if e["time"] > at
                 and (e.get("attempt") or 0) >= (inc.get("attempt") or 0)]

        def since(key: str, inc: dict[str, Any] = inc, at: float = at) -> float | None:
            return round(inc[key] - at, 2) if inc.get(key) is not None else None

        rows.append({"fault": fault["fault"], "node": fault.get("node"),
                     "class": inc["class"], "rung": inc["rung"],
                     "restore_tier": inc["restore_tier"], "steps_redone": inc["steps_lost"],
                     "detected_s": since("detected_at"), "recovered_s": since("recovered_at"),
                     "next_step_s": round(min(after) - at, 2) if after else None})
    times = [e["step_time_s"] for e in steps if e.get("step_time_s")]
    same = status.get("params_sha256") == reference
    expected = [("kill-worker", "in_place"), ("kill-node", "spare")]
    ladder_ok = [(r["fault"], r["rung"]) for r in rows] == expected \
        and len(incidents) == len(faults)
    recovered_ok = all(r["recovered_s"] is not None and r["recovered_s"] <= TARGET_RECOVERED_S
                       for r in rows)
    return {"benchmark": "many-nodes", "nodes": args.nodes, "spares": args.spares,
            "steps": args.steps, "job_id": job, "run_dir": str(paths.root),
            "status": status.get("status"),
            "startup_s": round(steps[0]["time"] - t0, 1) if steps else None,
            "step_time_s_mean": round(sum(times) / len(times), 3) if times else None,
            "incidents": rows, "incident_count": len(incidents),
            "params_sha256": status.get("params_sha256"), "reference_sha256": reference,
            "reference_s": round(reference_s, 1), "digest_equal": same,
            "wall_s": round(wall, 1),
            "targets": {"digest_equal": True, "rungs": expected,
                        "recovered_s_max": TARGET_RECOVERED_S,
                        "met": same and ladder_ok and recovered_ok}}

