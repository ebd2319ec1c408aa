"""``slurm-robust report RUN_DIR...``: post-mortem report (ETTR, incidents, node blame).

Reads each run directory's events.jsonl and verdicts.jsonl, health journals
(``--journal``), and with ``--sacct`` Slurm's own records (sacct, sacctmgr events,
sinfo -R); writes report.md, a self-contained report.html, headline.json and
plots/*.png to OUT_DIR. pandas and matplotlib are imported only when it runs.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_robust.errors import UsageError

if TYPE_CHECKING:
    from slurm_robust.analysis.pipeline import Inputs

HELP = "write a post-mortem report (ETTR, incidents, node blame) for run directories"


def parse_time(text: str) -> float:
    """Unix seconds, or ISO 8601 (local time when no offset is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError as exc:
        raise UsageError(f"bad time {text!r}: give Unix seconds or ISO 8601, "
                         f"e.g. 2025-01-31T12:00") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                        help="run directories (holding events.jsonl, verdicts.jsonl)")
    parser.add_argument("-o", "--out", required=True, metavar="OUT_DIR",
                        help="directory for report.md, report.html, headline.json, plots/")
    parser.add_argument("--journal", nargs="+", default=[], metavar="PATH",
                        help="node health journals: files, or directories searched for *.jsonl")
    parser.add_argument("--sacct", action="store_true",
                        help="also read sacct, sacctmgr node events and sinfo -R (fleet view)")
    parser.add_argument("--sacct-file", metavar="FILE",
                        help="recorded `sacct --parsable2 --duplicates` output with header, "
                             "instead of asking Slurm")
    parser.add_argument("--since", metavar="T",
                        help="start of the period (Unix seconds or ISO 8601)")
    parser.add_argument("--until", metavar="T",
                        help="end of the period (Unix seconds or ISO 8601)")
    parser.add_argument("--window", type=float, default=3600.0, metavar="SECONDS",
                        help="sliding ETTR window (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print the headline figures as one line of JSON")


def run(args: argparse.Namespace) -> int:
    # Lazy: pandas; `slurm-robust --help` imports this module and must stay fast.
    from slurm_robust.analysis.pipeline import analyse, load_inputs
    from slurm_robust.analysis.report import write_report

    since = None if args.since is None else parse_time(args.since)
    until = None if args.until is None else parse_time(args.until)
    if not args.run_dirs and not (args.sacct or args.sacct_file):
        raise UsageError("give at least one RUN_DIR, or --sacct / --sacct-file for a "
                         "fleet-only report")
    if since is not None and until is not None and until <= since:
        raise UsageError(f"--until ({args.until}) must be after --since ({args.since})")
    if not math.isfinite(args.window) or args.window <= 0:
        raise UsageError(f"--window must be a positive number of seconds, got {args.window}")
    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        raise UsageError(f"not a directory: {', '.join(missing)}")
    sacct_text = None
    if args.sacct_file:
        try:
            sacct_text = Path(args.sacct_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read --sacct-file: {exc}") from exc
    inputs = load_inputs(args.run_dirs, args.journal, sacct_text)
    if args.sacct:
        _add_live_slurm(inputs, since, until)
    analysis = analyse(inputs, since, until, window_s=args.window)
    paths = write_report(analysis, args.out)
    if args.json:
        print(json.dumps(analysis.headline()))
    else:
        for kind, path in paths.items():
            print(f"{kind}: {path}")
        unread = inputs.issues.total
        if unread:
            print(f"warning: {unread} input lines/records could not be read "
                  f"(see 'Unread input' in the report)")
    return 0


def _add_live_slurm(inputs: Inputs, since: float | None, until: float | None) -> None:
    # Lazy: pandas; `slurm-robust --help` imports this module and must stay fast.
    from slurm_robust.analysis.fetch import fetch_slurm_records

    recs = fetch_slurm_records(since, until, issues=inputs.issues)
    inputs.sacct = recs.jobs
    inputs.node_events = recs.node_events
