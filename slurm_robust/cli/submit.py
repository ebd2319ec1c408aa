"""``slurm-robust submit``: submit a robust training run (N nodes + k spares) via submitit."""

from __future__ import annotations

import argparse
import json

from slurm_robust.launcher.submit.executor import SlurmOptions, submit_run
from slurm_robust.launcher.submit.options import (
    add_robust_options,
    build_config,
    parse_time_minutes,
)
from slurm_robust.launcher.submit.status import format_status, run_status
from slurm_robust.slurm import Slurm
from slurm_robust.slurm.capacity import check_fits, pick_partition

HELP = "submit a robust training run: one agent per node, spares, recovery ladder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", "-N", type=int, required=True,
                        help="nodes that run workers (spares come on top)")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs to request on each node (also --nproc-per-node's "
                             "default; none: a CPU run)")
    parser.add_argument("--cpus-per-task", type=int, default=None,
                        help="CPUs for each node's agent and its workers")
    parser.add_argument("--partition", "-p", default=None,
                        help="Slurm partition (default: the cluster's default one)")
    parser.add_argument("--time", "-t", default="60",
                        help="time limit: minutes or [D-]HH:MM[:SS] (default 60)")
    parser.add_argument("--job-name", "-J", default="slurm-robust",
                        help="Slurm job name (default slurm-robust)")
    parser.add_argument("--exclude", "-x", default=None,
                        help="nodes never to run on (a Slurm hostlist); the node ledger's "
                             "lemons are added to it")
    parser.add_argument("--allow-lemons", action="store_true",
                        help="do not exclude the lemons (nodes blamed by several distinct "
                             "jobs: `slurm-robust node lemons`)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for the run to end and print its summary")
    add_robust_options(parser)


def run(args: argparse.Namespace) -> int:

    cfg = build_config(args, args.nodes, args.gpus_per_node)
    _check_partition_fits(args.partition, cfg.nodes, cfg.spares)
    slurm = SlurmOptions(partition=args.partition, time_min=parse_time_minutes(args.time),
                         gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task,
                         job_name=args.job_name, exclude=args.exclude,
                         allow_lemons=args.allow_lemons)
    job = submit_run(cfg, slurm)
    out = {"job_id": str(job.job_id), "run_dir": cfg.run_dir, "nodes": cfg.nodes,
           "spares": cfg.spares}
    if args.wait:
        import time

        while not job.done():
            time.sleep(2)
        status = run_status(cfg.run_dir)
        out["status"] = status
        if not args.json:
            print(format_status(status))
        code = 0 if status.get("status") == "completed" else 1
    else:
        code = 0
    if args.json:
        print(json.dumps(out, indent=2))
    elif not args.wait:
        print(f"submitted job {out['job_id']}; run directory {cfg.run_dir}")
        print(f"follow it with: slurm-robust status {cfg.run_dir}")
    return code


def _check_partition_fits(partition: str | None, nodes: int, spares: int) -> None:
    """Refuse now what Slurm would accept and leave pending forever (PartitionNodeLimit)."""

    check_fits(pick_partition(Slurm().partitions_raw(), partition), nodes, spares)
