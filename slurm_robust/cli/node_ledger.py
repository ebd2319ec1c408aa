"""``slurm-robust node history|lemons|pardon``: reading the node ledger (admins).

The ledger is root-only (slurm_robust/health/node_ledger.py): run as its owner. Every
error is one line (the CLI's SlurmRobustError handling) and a non-zero exit.
"""

from __future__ import annotations

import argparse
import getpass
import json
import time
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.ledger_writer import site_ledger_config
from slurm_robust.health.lemons import DAY_S, publish, scores
from slurm_robust.health.node_ledger import EventKind, NodeEvent, NodeLedger
from slurm_robust.slurm import check_node_name

LEDGER_ACTIONS = ("history", "lemons", "pardon")


def add_ledger_arguments(sub: Any) -> None:
    text = "a node's events in the node ledger: verdicts, checks, drains, deep checks (root)"
    p = sub.add_parser("history", help=text, description=text)
    p.add_argument("node", help="Slurm node name")
    p.add_argument("--limit", type=int, default=200, help="latest events shown (default 200)")
    p.add_argument("--json", action="store_true", help="print JSON")
    text = ("lemon scores: distinct jobs that blamed each node and its failed deep checks in "
            "the window; lemons are kept out of the reserve and of submissions (root)")
    p = sub.add_parser("lemons", help=text, description=text)
    p.add_argument("--all", action="store_true",
                   help="every node with events in the window, not only the lemons")
    p.add_argument("--json", action="store_true", help="print JSON")
    text = "clear a repaired node's record for the lemon score (its history is kept; root)"
    p = sub.add_parser("pardon", help=text, description=text)
    p.add_argument("node", help="Slurm node name")
    p.add_argument("--why", default="", help="what was done to the node (kept in its history)")
    p.add_argument("--json", action="store_true", help="print JSON")


def run_ledger(args: argparse.Namespace) -> int:
    cfg = site_ledger_config()
    if not cfg.enabled:
        raise UsageError("the node ledger is off (site config ledger.enabled is false)")
    ledger = NodeLedger(cfg)
    if args.action == "history":
        return _history(ledger, check_node_name(args.node), args.limit, args.json)
    if args.action == "pardon":
        node = check_node_name(args.node)
        ledger.record([NodeEvent(node, EventKind.PARDON, "admin",
                                 evidence={"by": getpass.getuser(), "why": args.why})])
        publish(cfg.lemons_path, [s.node for s in scores(ledger) if s.lemon])
        out = {"node": node, "pardoned": True}
        print(json.dumps(out) if args.json else
              f"{node} pardoned: earlier blames and deep checks no longer count as a lemon")
        return 0
    return _lemons(ledger, args.all, args.json)


def _history(ledger: NodeLedger, node: str, limit: int, as_json: bool) -> int:
    if limit < 1:
        raise UsageError(f"--limit {limit} must be >= 1")
    events = ledger.history(node, limit)
    now = time.time()
    score = next((s for s in scores(ledger, now) if s.node == node), None)
    since = now - ledger.cfg.lemon_window_days * DAY_S
    blamers = ledger.blaming_jobs(node, since)
    if as_json:
        print(json.dumps({"node": node, "score": score.as_dict() if score else None,
                          "blaming_jobs": blamers,
                          "events": [e.as_dict() for e in events]}, indent=2))
        return 0
    if score is None:
        print(f"{node}: no events in the last {ledger.cfg.lemon_window_days:g} days")
    else:
        head = f"LEMON: {score.why}" if score.lemon else "not a lemon"
        print(f"{node}: {head}; blamed by job(s) {', '.join(blamers) or '-'}; "
              f"{score.deep_failures} failed deep check(s) in "
              f"{ledger.cfg.lemon_window_days:g} days")
    for e in events:
        print(f"  {_when(e.time)}  {e.kind.value:<18} {e.source:<18} "
              f"job {e.job_id or '-':<8} {e.check or '-':<16} {_brief(e.evidence)}")
    if not events:
        print("  (no events recorded)")
    return 0


def _lemons(ledger: NodeLedger, show_all: bool, as_json: bool) -> int:
    found = [s for s in scores(ledger) if show_all or s.lemon]
    if as_json:
        print(json.dumps({"window_days": ledger.cfg.lemon_window_days,
                          "lemon_blames": ledger.cfg.lemon_blames,
                          "lemon_deep_failures": ledger.cfg.lemon_deep_failures,
                          "nodes": [s.as_dict() for s in found]}, indent=2))
        return 0
    print(f"lemons: {sum(s.lemon for s in found)} (blamed by >= {ledger.cfg.lemon_blames} "
          f"distinct jobs, or >= {ledger.cfg.lemon_deep_failures} failed deep checks, in "
          f"{ledger.cfg.lemon_window_days:g} days)")
    for s in found:
        mark = "LEMON" if s.lemon else "     "
        print(f"  {mark} {s.node:<14} jobs {s.blaming_jobs:<3} deep fails {s.deep_failures:<3}"
              f" {s.blames_per_30d:g} blames/30d over {s.service_days:g} d  {s.why}")
    return 0


def _brief(evidence: Any) -> str:
    if isinstance(evidence, dict):
        text = evidence.get("reason") or evidence.get("why") or json.dumps(evidence)
    else:
        text = json.dumps(evidence)
    return str(text)[:120]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
