"""``slurm-robust launch``: run the robust agents inside the current Slurm allocation."""

from __future__ import annotations

import argparse

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import env_defaults
from slurm_robust.launcher.submit.launch import allocation_nodes, default_run_dir, launch
from slurm_robust.launcher.submit.options import add_robust_options, build_config

HELP = "inside an sbatch script: run the robust agents on this allocation (N + spares nodes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="GPUs each node of this allocation has (--nproc-per-node's "
                             "default; none: a CPU run)")
    add_robust_options(parser)


def run(args: argparse.Namespace) -> int:

    job_id, total = allocation_nodes()
    spares = args.spares if args.spares is not None else env_defaults().get("spares", 0)
    if spares >= total:
        raise UsageError(f"--spares {spares} leaves no worker node in this {total}-node "
                         "allocation")
    if args.folder is None:
        args.folder = default_run_dir(job_id)
    cfg = build_config(args, total - spares, args.gpus_per_node)
    return launch(cfg, job_id)
