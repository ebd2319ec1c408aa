"""``slurm-robust inject partition|link-slow --node N [--clear]``: network faults.

Mini-cluster only, and only when it runs with ``cluster up --netns`` (each node in its own
network namespace; see rehearsal/slurm_robust_rehearsal/cluster/netns.py). ``partition``
cuts the node's link: every packet to and from it is dropped, its slurmd, agents and
workers keep running (the heartbeats are lost, not the processes); ``--clear`` brings
the link back, and with it whatever those processes still try to send. ``link-slow``
delays every packet the node sends by ``--delay-ms`` (tc netem); ``--clear`` removes the
delay. Registered by ``slurm_robust.cli.inject``.
"""

from __future__ import annotations

import argparse
import json
import time

from slurm_robust.launcher.errors import InjectionError
from slurm_robust.slurm import check_node_name
from slurm_robust_rehearsal.cluster import netns
from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.cluster.daemons import ClusterError

HELPS = {
    "partition": "netns mini-cluster: cut a node's link (processes stay alive); --clear "
                 "restores it",
    "link-slow": "netns mini-cluster: delay every packet a node sends by --delay-ms (tc "
                 "netem); --clear removes the delay",
}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for fault, text in HELPS.items():
        p = subparsers.add_parser(fault, help=text, description=text)
        p.add_argument("--node", required=True, help="Slurm node name of the mini-cluster")
        if fault == "link-slow":
            p.add_argument("--delay-ms", type=float, default=None,
                           help="added delay per packet the node sends, in ms (required "
                                "unless --clear)")
        p.add_argument("--clear", action="store_true", help="undo the fault on --node")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(_inject=_run, _fault=fault)


def apply(fault: str, node: str, clear: bool = False,
          delay_ms: float | None = None) -> dict[str, object]:
    """Apply or clear one network fault on the running mini-cluster; returns the record."""
    cfg = ClusterConfig().with_saved_shape()
    if node not in cfg.nodes:
        raise InjectionError(f"no node {node!r} in the mini-cluster (nodes: "
                             f"{', '.join(cfg.nodes)})")
    try:
        if fault == "partition":
            n = netns.set_link(cfg, node, up=clear)
        elif fault == "link-slow":
            if not clear and delay_ms is None:
                raise InjectionError("link-slow needs --delay-ms D (or --clear)")
            n = netns.set_delay(cfg, node, None if clear else delay_ms)
        else:
            raise InjectionError(f"unknown network fault {fault!r}")
    except ClusterError as exc:
        raise InjectionError(str(exc)) from exc
    record: dict[str, object] = {"fault": fault, "node": node, "addr": n.addr,
                                 "interface": n.host_if, "cleared": clear,
                                 "time": time.time()}
    if fault == "link-slow" and not clear:
        record["delay_ms"] = delay_ms
    return record


def _run(args: argparse.Namespace) -> int:
    node = check_node_name(args.node)
    record = apply(args._fault, node, args.clear, getattr(args, "delay_ms", None))
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        what = "cleared" if args.clear else "injected"
        print(f"{what} {args._fault} on {node} ({record['addr']})")
    return 0
