"""``slurm-robust update RUN_DIR|JOBID``: change a running job's code, arguments or
environment in place, or roll back (docs/USER_GUIDE.md, "Changing a running job")."""

from __future__ import annotations

import argparse
import json
import shlex

from slurm_robust.launcher.submit.status import resolve_run_dir
from slurm_robust.launcher.submit.update import parse_duration, request_update
from slurm_robust.launcher.versions import ApplyMode

HELP = "change a running job's code/args/env (--now or at the next restart), or roll back"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR|JOBID")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--code", metavar="DIR", help="snapshot this code directory")
    src.add_argument("--git", metavar="[REPO:]REV",
                     help="snapshot this revision (of the repository holding the script)")
    src.add_argument("--rollback", action="store_true", help="back to the previous version")
    parser.add_argument("--args", default=None,
                        help="the script's new arguments, one shell-quoted string")
    parser.add_argument("--env", action="append", default=[], metavar="K=V",
                        help="set an environment variable for the workers (repeatable)")
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--now", action="store_true",
                      help="restart the workers at the next step boundary (default)")
    when.add_argument("--at-next-restart", action="store_true",
                      help="apply at the next in-place restart or spare activation")
    parser.add_argument("--deadline", default=None,
                        help="with --at-next-restart: apply as --now after this long "
                             "(24h default; 90s, 30m, 2d)")
    parser.add_argument("--rollback-steps", type=int, default=10,
                        help="roll back automatically when the new version fails with a "
                             "user-code error or NaN within this many steps (0: never)")
    parser.add_argument("--message", "-m", default="", help="why (goes into the change log)")
    parser.add_argument("--json", action="store_true", help="print the change-log line")


def run(args: argparse.Namespace) -> int:
    from slurm_robust.errors import UsageError

    if args.deadline is not None and not args.at_next_restart:
        raise UsageError("--deadline goes with --at-next-restart")
    mode = ApplyMode.ROLLBACK if args.rollback else \
        ApplyMode.AT_NEXT_RESTART if args.at_next_restart else ApplyMode.NOW
    rec = request_update(
        resolve_run_dir(args.target), code=args.code, git=args.git,
        args=shlex.split(args.args) if args.args is not None else None, env=args.env,
        mode=mode, deadline_s=parse_duration(args.deadline) if args.deadline else None,
        rollback_steps=args.rollback_steps, message=args.message)
    if args.json:
        print(json.dumps(rec))
    elif mode is ApplyMode.ROLLBACK:
        print(f"rollback requested (from version {rec['from_version']})")
    else:
        print(f"version {rec['version']} ({rec['kind']} {rec['source']}, sha256 "
              f"{str(rec['digest'])[:12]}) requested, {mode.value.replace('_', ' ')}")
    return 0
