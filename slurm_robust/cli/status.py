"""``slurm-robust status RUN_DIR|JOBID``: where a robust run is, and its incidents."""

from __future__ import annotations

import argparse
import json

from slurm_robust.launcher.submit.status import format_status, run_status

HELP = "show a robust run: progress, incidents, recoveries, verdicts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR|JOBID")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:

    status = run_status(args.target)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0
