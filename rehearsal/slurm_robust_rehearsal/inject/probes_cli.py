"""``slurm-robust inject probe|clear``: node probe injection (registered by cli/inject.py)."""

from __future__ import annotations

import argparse
import json

from slurm_robust.health.probes import PROBES
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import check_node_name
from slurm_robust_rehearsal.inject.probes import clear_injections, inject_probe, parse_value


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "probe", help="make one probe return a chosen value on a node",
        description="Make one probe (an NVML reading, a disk reading) return VALUE on NODE "
                    "until `inject clear`; every check after the probe runs for real. "
                    "Refused unless the site config sets injection_enabled. Probes: "
                    + "; ".join(f"{k}: {v}" for k, v in PROBES.items()))
    p.add_argument("--node", required=True, help="Slurm node name")
    p.add_argument("--probe", required=True, choices=sorted(PROBES), metavar="PROBE",
                   help="the probe to override (listed above)")
    p.add_argument("--value", required=True, help='JSON, e.g. \'[{"gpu": 3, "xid": 79}]\'')
    p.set_defaults(_inject=_probe)
    c = subparsers.add_parser("clear", help="remove injected probe values on a node",
                          description="remove injected probe values on a node")
    c.add_argument("--node", required=True, help="Slurm node name")
    c.add_argument("--probe", choices=sorted(PROBES), metavar="PROBE",
                   help="clear only this probe (default: all)")
    c.set_defaults(_inject=_clear)


def _probe(args: argparse.Namespace) -> int:
    node = check_node_name(args.node)
    value = parse_value(args.value)
    path = inject_probe(load_site_config(), node, args.probe, value)
    print(json.dumps({"node": node, "probe": args.probe, "value": value, "file": str(path)}))
    return 0


def _clear(args: argparse.Namespace) -> int:
    node = check_node_name(args.node)
    removed = clear_injections(load_site_config(), node, args.probe)
    print(json.dumps({"node": node, "cleared": removed}))
    return 0
