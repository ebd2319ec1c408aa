"""``slurm-robust changes RUN_DIR|JOBID``: a run's change log."""

from __future__ import annotations

import argparse
import json
import time

from slurm_robust.launcher.submit.status import resolve_run
from slurm_robust.launcher.versions import read_changes, read_current

HELP = "show a run's code/data change log (versions requested, applied, rolled back)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR|JOBID")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    # Verified as the job user's (a job id) or as its owner's (a directory), and read
    # back only as that owner's files: root may run this on any user's run.
    run = resolve_run(args.target)
    run_dir = run.run_dir
    changes = read_changes(run_dir)
    current = read_current(run_dir, run.owner)
    if args.json:
        print(json.dumps({"run_dir": run_dir, "current_version": current["version"],
                          "changes": changes}, indent=2))
        return 0
    print(f"{run_dir}: running version {current['version']}")
    for c in changes:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.get("time", 0)))
        bits = [when, c.get("event", "?"), f"v{c.get('version')}"]
        for key in ("mode", "step", "restored_step", "downtime_s", "reason", "who",
                    "message"):
            if c.get(key) not in (None, ""):
                bits.append(f"{key}={c[key]}")
        print("  " + "  ".join(str(b) for b in bits))
    return 0
