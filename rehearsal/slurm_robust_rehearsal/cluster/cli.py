"""``slurm-robust cluster up|down|status|env``: the embedded Slurm mini-cluster.

The subcommand's module, in the rehearsal tooling: ``slurm_robust.cli.main`` names it in
its registry and imports it only when the subcommand runs (or for ``--help``)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace

from slurm_robust.errors import UsageError
from slurm_robust_rehearsal.cluster import netns
from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.cluster.manager import (
    MiniCluster,
    choose_network,
    install_packages,
    missing_packages,
)

HELP = "start, stop and inspect the embedded Slurm mini-cluster (real daemons on localhost)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "down", "status", "env", "wipe", "packages",
                                           "reboot"],
                        help="up: start (idempotent); down: stop what up started; "
                             "packages: apt-get install the Debian packages it needs; "
                             "status: daemons and nodes; env: shell exports; "
                             "wipe: delete the cluster directory (after down); "
                             "reboot: restart one node's slurmd (--node), the "
                             "mini-cluster's reboot")
    parser.add_argument("--node", help="reboot: the node to reboot")
    parser.add_argument("--dir", help="cluster directory (default .minicluster/ in the "
                                      "checkout, or $SLURM_ROBUST_CLUSTER_DIR)")
    parser.add_argument("--no-install", action="store_true",
                        help="fail instead of apt-get installing missing packages")
    parser.add_argument("--nodes", type=int, default=None,
                        help="up: nodes of the train partition (default 4, or as last up)")
    parser.add_argument("--spares", type=int, default=None,
                        help="up: nodes of the standby partition (default 2, or as last up)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--netns", dest="netns", action="store_true", default=None,
                      help="up: each node in its own network namespace with its own address "
                           "on a bridge (root; iproute2; the default where they can be "
                           "made); needed by `inject partition` and `inject link-slow`")
    mode.add_argument("--shared-net", dest="netns", action="store_false",
                      help="up: every node on 127.0.0.1 in the host's network (the default "
                           "where namespaces cannot be made)")
    parser.add_argument("--reserve-timer", type=float, default=0.0, metavar="SECONDS",
                        help="with up: run `reserve reconcile` at once (fresh spares before "
                             "the first handoff) and then every SECONDS (0: off, the "
                             "default, so tests control the reserve themselves)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--prometheus", action="store_true",
                        help="up/packages: also a Prometheus server scraping the robust "
                             "jobs and the reserve exporter (Debian package prometheus)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path


    cfg = ClusterConfig(root=Path(args.dir).resolve()) if args.dir else ClusterConfig()
    cfg = cfg.with_saved_shape()  # down/status/env see the nodes the last up started
    if args.nodes is not None or args.spares is not None:
        if args.action != "up":
            raise UsageError("--nodes and --spares size the cluster at `cluster up` only")
        try:
            cfg = cfg.sized(len(cfg.train_nodes) if args.nodes is None else args.nodes,
                            len(cfg.spare_nodes) if args.spares is None else args.spares)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    if args.netns is not None:
        if args.action != "up":
            raise UsageError("--netns and --shared-net choose the network at `cluster up` "
                             "only")
        cfg = replace(cfg, netns=args.netns)
        if args.netns:
            why = netns.unavailable_reason()
            if why is not None:
                raise UsageError(f"cannot use --netns: {why}; use --shared-net")
    elif args.action == "up":
        cfg, notice = choose_network(cfg)
        if notice:
            print(notice, file=sys.stderr)
    mc = MiniCluster(cfg)
    if (args.node is not None) != (args.action == "reboot"):
        raise UsageError("`cluster reboot` takes --node NODE; no other action does")
    if args.action == "reboot":
        pid = mc.reboot_node(args.node)
        print(json.dumps({"node": args.node, "slurmd_pid": pid}) if args.json
              else f"{args.node}: slurmd restarted (pid {pid})")
        return 0
    if args.action == "env":
        for key, value in cfg.env().items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    if args.action == "up":
        rep = mc.up(install=not args.no_install, prometheus=args.prometheus)
        for notice in rep.notices:
            print(notice, file=sys.stderr)
        out = {"seconds": round(rep.seconds, 2), "started": rep.started,
               "already_running": rep.already_running, "slurm_conf": str(cfg.slurm_conf)}
        if args.reserve_timer > 0:
            out["reserve_timer_pid"] = mc.start_reserve_timer(args.reserve_timer)
        if args.json:
            print(json.dumps(out))
        elif rep.started:
            print(f"mini-cluster up in {rep.seconds:.1f} s ({len(rep.started)} daemons "
                  f"started); run: eval \"$(slurm-robust cluster env)\"")
        else:
            print(f"mini-cluster already up ({rep.seconds:.1f} s to check)")
        return 0
    if args.action == "down":
        survivors = mc.down()
        if args.json:
            print(json.dumps({"survivors": survivors}))
        elif survivors:
            print(f"mini-cluster down, but pids {survivors} would not die")
        else:
            print("mini-cluster down")
        return 1 if survivors else 0
    if args.action == "packages":

        missing = missing_packages(args.prometheus)
        install_packages(missing)
        print("installed: " + " ".join(missing) if missing else "all packages present")
        return 0
    if args.action == "wipe":
        mc.wipe()
        return 0
    status = mc.status()
    if args.json:
        print(json.dumps(status))
    else:
        print(f"root: {status['root']}  up: {status['up']}")
        for name, pid in status["daemons"].items():  # type: ignore[union-attr]
            print(f"  {name:16} {'pid ' + str(pid) if pid else 'not running'}")
        for node, state in status["nodes"].items():  # type: ignore[union-attr]
            print(f"  {node:16} {state}")
    return 0 if status["up"] else 1
