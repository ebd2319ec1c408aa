"""``slurm-robust inject {kill-worker,stop-worker,nan,kill-node,slow-worker,sdc} --job J``.

Registered by ``slurm_robust.cli.inject`` (``register(subparsers)``); the work is done by
:mod:`slurm_robust_rehearsal.inject.job`.
"""

from __future__ import annotations

import argparse
import json

from slurm_robust.slurm import check_job_id
from slurm_robust_rehearsal.inject.job import inject

HELPS = {
    "kill-worker": "SIGKILL one worker of a robust job",
    "stop-worker": "SIGSTOP one worker (a hang)",
    "nan": "make one worker's next step produce a NaN loss",
    "kill-node": "mini-cluster: kill a node's slurmd and the job's processes on it, wipe "
                 "its local checkpoint dirs",
    "slow-worker": "slow one worker down (SIGSTOP/SIGCONT duty cycle) for --duration s",
    "sdc": "silent data corruption on --node: its gradients go NaN at random steps "
           "(a new draw per attempt, so the NaN moves between replays)",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    for fault, text in HELPS.items():
        p = subparsers.add_parser(fault, help=text, description=text)
        p.add_argument("--job", required=True, help="Slurm job id of the robust run")
        p.add_argument("--node", default=None, help="node to hit (default: see --rank)")
        p.add_argument("--rank", type=int, default=None,
                       help="rank to hit (default: the highest rank on --node, or overall)")
        p.add_argument("--run-dir", default=None,
                       help="the run directory (default: from the job's comment)")
        if fault == "slow-worker":
            p.add_argument("--duration", type=float, default=10.0,
                           help="seconds (it ends early when the worker exits)")
            p.add_argument("--period", type=float, default=0.2,
                           help="seconds per stop/continue cycle; keep it well below a "
                                "step's compute time so every step is slowed alike")
            p.add_argument("--slowdown", type=float, default=2.0,
                           help="how many times slower the worker runs (default 2: "
                                "stopped half of each cycle)")
        if fault == "nan":
            p.add_argument("--mode", choices=("param", "data"), default="param",
                           help="param: poison a parameter once (default); data: a "
                                "poisoned sample a few steps ahead, back on every replay")
        if fault == "sdc":
            p.add_argument("--probability", type=float, default=0.1,
                           help="chance per step that the node corrupts a gradient")
            p.add_argument("--bitwise", action="store_true",
                           help="the node also fails the bitwise reference test")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(_inject=_run_fault, _fault=fault)


def _run_fault(args: argparse.Namespace) -> int:

    record = inject(args._fault, check_job_id(args.job), node=args.node, rank=args.rank,
                    run_dir=args.run_dir, duration_s=getattr(args, "duration", 10.0),
                    period_s=getattr(args, "period", 0.2),
                    slowdown=getattr(args, "slowdown", 2.0),
                    mode=getattr(args, "mode", "param"),
                    probability=getattr(args, "probability", 0.1),
                    bitwise=getattr(args, "bitwise", False))
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        where = f"rank {record['rank']} (pid {record.get('pid')}) on {record['node']}" \
            if "rank" in record else f"node {record['node']}"
        print(f"injected {args._fault} into job {args.job}: {where}")
    return 0
