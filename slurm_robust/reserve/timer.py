"""Run ``reserve reconcile`` on a timer: ``python -m slurm_robust.reserve.timer --every S``.

The reserve must have fresh spares *before* the first handoff (right
after ``cluster up`` it had 0 fresh spares, "deep pass never", so an early handoff found
none). The first pass runs at once, then one every ``--every`` seconds; each pass prints
one JSON line (``slurm_robust.reserve_timer`` v1: ``target``, ``spares_before``,
``spares_after``, ``actions``, ``ok``, or ``error``). A failed pass (slurmctld away, the
lock held too long) is logged and retried at the next tick; the loop never dies of one.
On a real cluster, run it from a systemd timer or cron instead (one pass: ``--once``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health.breaker import site_breaker
from slurm_robust.health.ledger_writer import SiteLedger
from slurm_robust.records import make_record
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.gate import LocalSuiteGate
from slurm_robust.reserve.reconcile import reconcile
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import RetryPolicy, Slurm

SCHEMA, VERSION = "slurm_robust.reserve_timer", 1


def one_pass(config: str | None) -> dict[str, object]:
    site = load_site_config(config)
    cfg = reserve_config(site)
    slurm = Slurm(policy=RetryPolicy(timeout_s=cfg.call_timeout_s))
    try:
        rep = reconcile(slurm, LocalSuiteGate(site, slurm.node_address), cfg,
                        breaker=site_breaker(site.breaker), ledger=SiteLedger(site))
    except SlurmRobustError as exc:
        return {"ok": False, "error": str(exc)[:500]}
    return {"ok": all(o.get("ok") for o in rep.outcomes), "target": rep.target,
            "spares_before": rep.spares_before, "spares_after": rep.spares_after,
            "actions": len(rep.outcomes)}


def loop(every_s: float, config: str | None, once: bool = False,
         sleep: Callable[[float], None] = time.sleep,
         run: Callable[[str | None], dict[str, object]] = one_pass) -> int:
    while True:
        out = run(config)
        print(json.dumps(make_record(SCHEMA, VERSION, out)), flush=True)
        if once:
            return 0 if out.get("ok") else 1
        sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurm_robust.reserve.timer",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--every", type=float, default=300.0, help="seconds between passes")
    p.add_argument("--config", help="site config (default $SLURM_ROBUST_CONFIG)")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    args = p.parse_args(argv)
    if args.every <= 0:
        p.error("--every must be > 0")
    return loop(args.every, args.config, args.once)


if __name__ == "__main__":
    sys.exit(main())
