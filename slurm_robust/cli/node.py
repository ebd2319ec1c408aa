"""``slurm-robust node resume NODE``: re-check a drained node and return it to service.

Runs the deep suite for NODE on this host (run it on the node itself, or -- as in the
mini-cluster -- on a host that shares the node's state directory and hardware) and
resumes the node in Slurm only if every check passes. Two drains need a person's word,
``--force``: a reason slurm_robust did not write (an admin's note), and a repeat offender
(a node that failed again soon after it was returned: investigate its hardware first).
A node drained "pending deep check" (a job's suspicion) needs no --force.
"""

from __future__ import annotations

import argparse
import json

from slurm_robust.cli.check import print_result
from slurm_robust.errors import SlurmRobustError
from slurm_robust.health import run_suite
from slurm_robust.health.drain import PREFIX, SLURM_REASONS
from slurm_robust.reserve.history import REPEAT_MARK
from slurm_robust.slurm import Slurm, check_node_name

HELP = "re-run the deep self-check on a node and resume it only if it passes"


class ResumeRefusedError(SlurmRobustError):
    """The node carries a drain reason slurm_robust did not write."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    p = sub.add_parser("resume", help=HELP, description=__doc__)
    p.add_argument("node", help="Slurm node name")
    p.add_argument("--force", action="store_true",
                   help="resume an admin's drain (a reason slurm_robust did not write) or "
                        "a repeat offender; the deep suite must still pass")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    return resume(check_node_name(args.node), force=args.force, as_json=args.json)


def resume(node: str, force: bool = False, as_json: bool = False) -> int:

    slurm = Slurm()
    before = slurm.node(node)
    reason = (before.reason or "").strip()
    if before.drained and reason and not reason.startswith((PREFIX, *SLURM_REASONS)) \
            and not force:
        raise ResumeRefusedError(
            f"{node} was drained by {before.reason_user or 'someone'} with reason {reason!r}, "
            "not by slurm_robust; resolve it, then rerun with --force")
    if REPEAT_MARK in reason and not force:
        raise ResumeRefusedError(
            f"{node} is a repeat offender ({reason!r}); it failed again soon after it was "
            "returned. Investigate the hardware, then rerun with --force")
    result = run_suite("resume", node)
    resumed = False
    if result.passed and before.drained:
        slurm.resume(node)
        resumed = True
    if as_json:
        print(json.dumps({**result.to_dict(), "resumed": resumed,
                          "was_drained": before.drained, "previous_reason": reason}))
    else:
        print_result(result)
        if resumed:
            print(f"{node} resumed (was drained: {reason!r})")
        elif result.passed:
            print(f"{node} was not drained; nothing to resume")
        else:
            print(f"{node} stays drained")
    return 0 if result.passed else 1
