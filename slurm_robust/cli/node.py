"""``slurm-robust node resume|status|history|lemons|pardon``: a node's service and record.

``status [NODE...]`` prints each node's Slurm state, drain reason and place in the
break-fix loop (health/repair.py: deep check, reboot, re-validation, rounds, or handed to
a human), read from the drain reasons the loop writes; with the node's ``repair.json``
where it is readable here, its last step.

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
from slurm_robust.health.repair import RESUME_REQUEST, load_record, loop_state
from slurm_robust.reserve.history import REPEAT_MARK
from slurm_robust.reserve.remote_check import (
    caller_name,
    check_on_node,
    require_privilege,
    wait_budget_s,
)
from slurm_robust.site_config import load_site_config
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
    text = ("each node's state, drain reason and place in the break-fix loop (round, "
            "deep check, reboot, handed to a human)")
    p = sub.add_parser("status", help=text, description=text)
    p.add_argument("nodes", nargs="*", metavar="NODE", help="Slurm node names (default all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
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
    if args.action == "status":
        return status([check_node_name(n) for n in args.nodes], args.json)
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
    res = check_on_node(slurm, node, f"{RESUME_REQUEST} {caller_name()}", budget)
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


def status(names: list[str], as_json: bool = False) -> int:
    slurm = Slurm()
    site = load_site_config()
    nodes = slurm.nodes()
    if names:
        known = {n.name for n in nodes}
        missing = [n for n in names if n not in known]
        if missing:
            raise SlurmRobustError(f"no such node(s) in Slurm: {', '.join(missing)}")
        nodes = [n for n in nodes if n.name in names]
    rows = []
    for n in nodes:
        loop = loop_state(n.reason or "")
        last = None
        if loop is not None:
            try:
                record = load_record(site.state_path(n.name), n.name)
            except (OSError, SlurmRobustError):
                record = None
            if record is not None and record.history:
                last = record.history[-1]
        rows.append({"node": n.name, "state": n.state, "drained": n.drained,
                     "reason": n.reason or "", "repair": loop, "last_step": last})
    if as_json:
        print(json.dumps({"nodes": rows}, indent=2))
        return 0
    for r in rows:
        loop = r["repair"]
        where = ""
        if loop is not None:
            of = f"/{loop['rounds']}" if loop["rounds"] else ""
            where = f"  repair: {loop['phase']}, round {loop['round']}{of}"
            h = r["last_step"]
            if h:
                outcome = {True: "passed", False: "failed"}.get(h["passed"], h["detail"])
                where += f" (last: {h['step']} {outcome})"
        state = "drained" if r["drained"] else r["state"]
        print(f"{r['node']:12} {state:10} {r['reason'] or '-'}{where}")
    return 0


def _print(as_json: bool, obj: dict[str, object], text: str) -> None:
    print(json.dumps(obj) if as_json else text)
