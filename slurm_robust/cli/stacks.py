"""``slurm-robust stacks``: capture every rank's stacks, and find the group to evict.

    slurm-robust stacks capture --job J                 # a running robust job
    slurm-robust stacks capture --run-dir D [--node N]  # from the agents' pid files
    slurm-robust stacks capture --pids 0=4242,1=4243 --out DIR
    slurm-robust stacks analyze DIR --layout tp=2,pp=4,dp=4 [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from slurm_robust.errors import UsageError
from slurm_robust.launcher.submit.status import resolve_run_dir
from slurm_robust.layout import ParallelLayout, parse_layout
from slurm_robust.stacks.analyze import AnalyzeOptions, analyze, explain
from slurm_robust.stacks.capture import CaptureOptions, capture_local
from slurm_robust.stacks.dumps import read_capture
from slurm_robust.stacks.handler import DEFAULT_TEMPLATE
from slurm_robust.stacks.runcapture import capture_run
from slurm_robust.stacks.signature import SignatureOptions

HELP = "capture stack dumps of a job's ranks and name the parallel group to evict"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="stacks_command", metavar="ACTION")
    sub.required = True
    cap = sub.add_parser("capture", help="dump the stacks of every worker and its children",
                         description="dump the stacks of every worker and its children")
    cap.add_argument("--job", help="job id of a running robust job (its run dir comes from "
                                   "the job comment; remote nodes are reached through srun)")
    cap.add_argument("--run-dir", help="the run directory (agents/<node>.json name the pids)")
    cap.add_argument("--node", action="append", default=[],
                     help="capture only this node (repeatable)")
    cap.add_argument("--pids", help="ad-hoc: rank=pid,... of processes on this machine")
    cap.add_argument("--out", help="with --pids: the capture directory to write")
    cap.add_argument("--capture-id", help="name of the capture directory (default: time-pid)")
    cap.add_argument("--local-only", action="store_true",
                     help="never use srun; skip nodes whose pids are not on this machine")
    cap.add_argument("--srun", action="store_true",
                     help="with --job: capture every node through srun, even when its pids "
                          "are visible here (all nodes on one host, as in the mini-cluster)")
    cap.add_argument("--method", choices=("auto", "py-spy", "faulthandler"), default="auto",
                     help="auto: py-spy, faulthandler where ptrace is refused")
    cap.add_argument("--native", action="store_true", help="native frames too (slower)")
    cap.add_argument("--budget-s", type=float, default=10.0,
                     help="wall-time budget per node (default 10)")
    cap.add_argument("--json", action="store_true", help="print the result as JSON")
    ana = sub.add_parser("analyze", help="group the stacks of a capture and name a group",
                         description="group the stacks of a capture and name a group")
    ana.add_argument("dir", help="a capture directory, or a run directory (latest capture)")
    ana.add_argument("--layout", default="",
                     help="tp=..,pp=..,dp=.. in Megatron order (default: data-parallel only)")
    ana.add_argument("--ranks-per-node", type=int,
                     help="for ranks without a dump: rank // N is their node index")
    ana.add_argument("--ignore-lines", action="store_true",
                     help="match frames without line numbers (mixed code versions)")
    ana.add_argument("--single-rank-dim", choices=("pp", "tp", "dp"), default="pp",
                     help="group evicted for a single suspect rank (default pp)")
    ana.add_argument("--json", action="store_true", help="print the analysis as JSON")


def run(args: argparse.Namespace) -> int:
    if args.stacks_command == "capture":
        return _capture(args)
    return _analyze(args)


def _capture(args: argparse.Namespace) -> int:

    if args.pids:
        if not args.out:
            raise UsageError("stacks capture --pids needs --out DIR")
        if args.method == "faulthandler":
            raise UsageError("--method faulthandler needs --run-dir or --job (the handler "
                             "files live in the run directory)")
        options = CaptureOptions(method=args.method, native=args.native,
                                 budget_s=args.budget_s)
        result = capture_local(_parse_pids(args.pids), (args.node or ["local"])[0], args.out,
                               options, args.capture_id)
        report = {"directory": str(result.directory), "nodes": [result.summary()]}
    else:
        run_dir = args.run_dir
        if run_dir is None:
            if not args.job:
                raise UsageError("stacks capture needs --job J, --run-dir D or --pids")

            run_dir = resolve_run_dir(str(args.job))
        options = CaptureOptions(method=args.method, native=args.native,
                                 budget_s=args.budget_s,
                                 faulthandler_template=str(Path(run_dir) / DEFAULT_TEMPLATE))
        out, nodes = capture_run(run_dir, options, args.capture_id, args.node or None,
                                 job_id=args.job, local_only=args.local_only,
                                 force_srun=args.srun)
        report = {"directory": str(out), "nodes": [n.to_json() for n in nodes]}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"stacks written to {report['directory']}")
        for node in report["nodes"]:
            print(f"  {json.dumps(node)}")
        print(f"next: slurm-robust stacks analyze {report['directory']} "
              "--layout tp=..,pp=..,dp=..")
    return 0


def _parse_pids(text: str) -> dict[int, int]:
    workers = {}
    for part in filter(None, text.split(",")):
        rank, sep, pid = part.partition("=")
        if not sep or not rank.strip().isdigit() or not pid.strip().isdigit():
            raise UsageError(f"--pids: cannot parse {part!r}; expected rank=pid,rank=pid")
        workers[int(rank)] = int(pid)
    return workers


def _analyze(args: argparse.Namespace) -> int:

    directory = find_capture_dir(Path(args.dir))
    dumps = read_capture(directory)
    if args.layout:
        layout = parse_layout(args.layout, ranks_per_node=args.ranks_per_node)
    else:
        layout = ParallelLayout(dp=max(d.rank for d in dumps) + 1,
                                ranks_per_node=args.ranks_per_node)
    options = AnalyzeOptions(signature=SignatureOptions(keep_lines=not args.ignore_lines),
                             single_rank_dim=args.single_rank_dim)
    result = analyze(dumps, layout, options)
    if args.json:
        print(json.dumps({"directory": str(directory), **result.to_json()}))
    else:
        print(f"capture {directory}")
        print(explain(result))
    return 0


def find_capture_dir(path: Path) -> Path:
    """A capture directory as given, or the newest capture under a run directory."""
    if any(path.glob("rank*.json")):
        return path
    stacks = path / "stacks" if (path / "stacks").is_dir() else path
    captures = sorted((p for p in stacks.iterdir() if p.is_dir() and any(p.glob("rank*.json"))),
                      key=lambda p: p.stat().st_mtime) if stacks.is_dir() else []
    if not captures:
        raise UsageError(f"no capture found in {path}: give a directory holding rank*.json "
                         f"or a run directory with stacks/<capture>/")
    return captures[-1]
