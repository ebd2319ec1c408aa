"""``slurm-robust breaker status|reset``: the drain circuit breaker (health/breaker.py).

``status`` shows the automatic drains in the current window, whether the breaker tripped,
and the latest "would drain" records (the failures it held back). ``reset`` forgets the
window's drains after an admin has looked at them, so automatic drains go ahead again;
it needs write access to the breaker's directory (root).
"""

from __future__ import annotations

import argparse
import getpass
import json
import time

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.health.breaker import BreakerUnavailable, DrainBreaker, breaker_config
from slurm_robust.site_config import load_site_config

HELP = "show or reset the drain circuit breaker (a cap on automatic drains per window)"


class BreakerError(SlurmRobustError):
    """The breaker's state could not be read or changed here."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    text = "drains in the window, tripped or not, and the latest would-drains"
    p = sub.add_parser("status", help=text, description=text)
    p.add_argument("--json", action="store_true", help="print JSON")
    text = "forget the window's drains, so automatic drains go ahead again (root, after review)"
    p = sub.add_parser("reset", help=text, description=text)
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    cfg = breaker_config(load_site_config().breaker)
    breaker = DrainBreaker(cfg)
    try:
        if args.action == "reset":
            if not cfg.enabled:
                raise UsageError("the drain circuit breaker is off (site config breaker "
                                 "sets no limit): nothing to reset")
            forgotten = breaker.reset(getpass.getuser())
            out = {"reset": True, "forgotten": forgotten}
            print(json.dumps(out) if args.json else
                  f"breaker reset: {forgotten} drain(s) in the window forgotten")
            return 0
        status = breaker.status()
    except BreakerUnavailable as exc:
        raise BreakerError(str(exc)) from exc
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    if not status["enabled"]:
        print("drain circuit breaker: off (site config breaker sets no limit)")
        return 0
    state = ("TRIPPED at " + ", ".join(status["limits_reached"])) if status["tripped"] \
        else "closed"
    limits = [f"{status['max_drains']} node(s)"] if status["max_drains"] else []
    limits += [f"{status['max_share']:.1%} of the nodes"] if status["max_share"] else []
    limits += [f"partition {k}: " + " / ".join(
        x for x in ((f"{v['max_drains']}" if v["max_drains"] else ""),
                    (f"{v['max_share']:.1%}" if v["max_share"] else "")) if x)
        for k, v in status["partitions"].items()]
    print(f"drain circuit breaker: {state}: {status['in_window']} drain(s) in the last "
          f"{status['window_s']:g} s; limits {'; '.join(limits)} ({status['dir']})")
    if status.get("note"):
        print(f"  note: {status['note']}")
    for d in status["drains"]:
        print(f"  drained  {_when(d['time'])}  {d['node']}  [{d.get('source')}] "
              f"{d.get('reason', '')}")
    for w in status["would_drain"]:
        if "reset_by" in w:
            print(f"  reset    {_when(w['time'])}  by {w['reset_by']}")
        else:
            print(f"  WOULD    {_when(w['time'])}  {w.get('node')}  [{w.get('source')}] "
                  f"{w.get('reason', '')}")
    return 0


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
