"""``slurm-robust check``: run a self-check suite on this node by hand."""

from __future__ import annotations

import argparse
import json
import os
import socket

from slurm_robust.health import run_suite
from slurm_robust.health.breaker import breaker_config
from slurm_robust.health.node_ledger import ledger_config
from slurm_robust.launcher.node.monitor import MonitorSettings
from slurm_robust.reserve.config import reserve_config
from slurm_robust.site_config import SiteConfig, load_site_config
from slurm_robust.slurm import check_node_name

HELP = ("run the node self-checks (quick = prolog suite, deep = epilog suite) and journal "
        "them; the whole site config is checked first")
STAGE_TO_SUITE = {"prolog": "quick", "epilog": "deep", "all": "all"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stage", choices=sorted(STAGE_TO_SUITE), default="prolog",
                        help="prolog: quick suite; epilog: deep suite; all: every check "
                             "(default: prolog)")
    parser.add_argument("--node", help="node name (default: $SLURMD_NODENAME or the host name)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--verdict", action="store_true",
                        help="print the run's verdict document (PASS, INFO, WARNING, "
                             "CRITICAL, UNKNOWN per check, with the recommended actions)")
    parser.add_argument("--no-journal", action="store_true",
                        help="do not append the results to the node's health journal")


def default_node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def validate_site_config(site: SiteConfig) -> None:
    """Check the sections that other programs read later: ``reserve`` (reserve commands,
    EpilogSlurmctld), ``monitor`` (every job's agents, at start), ``breaker`` (every
    drain) and ``ledger`` (every recorded node event). A typo there must
    fail here, on the admin's terminal, and not in the first robust job; ``checks`` is
    checked by the suite itself. Raises UsageError naming the key and the valid ones."""
    reserve_config(site)
    MonitorSettings.from_site(site.monitor)
    breaker_config(site.breaker)
    ledger_config(site.ledger)


def run(args: argparse.Namespace) -> int:
    node = check_node_name(args.node or default_node())
    site = load_site_config()
    validate_site_config(site)
    result = run_suite("manual", node, config=site, suite=STAGE_TO_SUITE[args.stage],
                       journal=not args.no_journal)
    if args.verdict:
        print(json.dumps(result.verdict))
    elif args.json:
        print(json.dumps(result.to_dict()))
    else:
        print_result(result)
    # Health Validation's convention: 0 PASS/INFO/WARNING, 1 CRITICAL/UNKNOWN (the
    # node should not be admitted); a configuration error exits 2 (cli/main.py).
    return int(result.verdict["exit_code"]) if result.verdict else 1


def print_result(result: object) -> None:
    """One line per check, then the verdict (for people; --json for programs)."""
    d = result.to_dict()  # type: ignore[attr-defined]
    for r in d["results"]:
        flag = " (injected)" if r["injected"] else ""
        print(f"{r['status']:<5} {r['check']:<20} {r['duration_s']:7.3f}s  "
              f"{r['reason'] or json.dumps(r['evidence'])[:100]}{flag}")
    verdict = "PASSED" if d["passed"] else f"FAILED: {d['reason']}"
    print(f"{d['node']} {d['suite']} suite {verdict} ({d['severity']})")
    for step in (result.verdict or {}).get("actions", []):  # type: ignore[attr-defined]
        print(f"next: {step}")
    if d["journal"]:
        print(f"journal: {d['journal']}")
