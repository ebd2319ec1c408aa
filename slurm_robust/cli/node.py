"""``slurm-robust node resume|history|lemons|pardon``: a node's service and its record.

``history NODE`` prints the node ledger's events of NODE (verdicts, check failures, drains,
deep checks, returns to service), ``lemons`` the lemon score of every node with events in
the window, ``pardon NODE`` clears a repaired node's record for the score. The ledger is
root-only (health/node_ledger.py): these three need its owner (root); users see the
lemons' names in the published lemons file instead.

``resume NODE``: deep-check a drained node ON the node, then resume it.

The deep suite runs on NODE itself, through Slurm: the node is marked ``slurm_robust:
pending deep check: resume requested by USER`` and its own slurmd runs slurm_robust's
HealthCheckProgram, which checks it as root and resumes it only if every check passes
(otherwise it stays drained with ``slurm_robust: deep check failed: <check>: ...``). This
command waits for that answer within a budget. Needs root or a Slurm operator. A drain
reason that slurm_robust did not write (an admin's note) and a repeat offender (a node
that failed again soon after it was returned: investigate its hardware first) are kept
unless ``--force``; a node drained "pending deep check" (a job's suspicion) needs none.
"""

from __future__ import annotations

import argparse
import json

from slurm_robust.cli.node_ledger import LEDGER_ACTIONS, add_ledger_arguments, run_ledger
from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.drain import PREFIX, SLURM_REASONS
from slurm_robust.reserve.history import REPEAT_MARK
from slurm_robust.reserve.remote_check import (
    caller_name,
    check_on_node,
    require_privilege,
    wait_budget_s,
)
from slurm_robust.slurm import Slurm, check_node_name

HELP = ("a node's service and record: deep-check and resume it, its history in the node "
        "ledger, lemon scores")
RESUME_HELP = "deep-check a drained node on the node itself and resume it only if it passes"

RESUME_DOC = (__doc__ or "")[(__doc__ or "").index("``resume NODE``"):]


class ResumeRefusedError(SlurmRobustError):
    """The node carries a drain reason slurm_robust did not write."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    add_ledger_arguments(sub)
    p = sub.add_parser("resume", help=RESUME_HELP,
                      description=RESUME_DOC.replace("``", "`"))
    p.add_argument("node", help="Slurm node name")
    p.add_argument("--force", action="store_true",
                   help="resume an admin's drain (a reason slurm_robust did not write) or "
                        "a repeat offender; the deep suite must still pass")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds to wait for the node's check (default: two "
                        "HealthCheckIntervals plus the deep suite's allowance)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    if args.action in LEDGER_ACTIONS:
        return run_ledger(args)
    return resume(check_node_name(args.node), force=args.force, as_json=args.json,
                  timeout_s=args.timeout)


def resume(node: str, force: bool = False, as_json: bool = False,
           timeout_s: float | None = None) -> int:
    slurm = Slurm()
    require_privilege(slurm)
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
    if not before.drained:
        _print(as_json, {"node": node, "resumed": False, "passed": None, "was_drained": False,
                         "previous_reason": reason, "reason": "", "waited_s": 0.0},
               f"{node} is not drained; nothing to resume")
        return 0
    budget = wait_budget_s(slurm) if timeout_s is None else timeout_s
    res = check_on_node(slurm, node, f"resume requested by {caller_name()}", budget)
    out = {"node": node, "resumed": res.passed, "passed": res.passed if res.done else None,
           "was_drained": True, "previous_reason": reason, "reason": res.reason,
           "waited_s": round(res.waited_s, 1)}
    if res.passed:
        text = f"{node} passed its deep check on the node and was resumed (was: {reason!r})"
    elif res.done:
        text = f"{node} stays drained: {res.reason}"
    else:
        text = (f"{node}: no answer from its deep check within {budget:g} s; it stays "
                f"drained ({res.reason!r}) and returns by itself once its check passes")
    _print(as_json, out, text)
    return 0 if res.passed else 1


def _print(as_json: bool, obj: dict[str, object], text: str) -> None:
    print(json.dumps(obj) if as_json else text)
