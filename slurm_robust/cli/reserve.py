"""``slurm-robust reserve size|status|reconcile|reset``: the warm reserve (standby partition)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.breaker import site_breaker
from slurm_robust.health.ledger_writer import SiteLedger
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.layout import reset, slurm_conf_path
from slurm_robust.reserve.reconcile import reconcile, status
from slurm_robust.reserve.remote_check import SlurmNodeGate
from slurm_robust.reserve.sizing import binomial_cdf, binomial_quantile
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import RetryPolicy, Slurm

HELP = "size, inspect and reconcile the warm reserve of deep-checked standby nodes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="reserve_action", metavar="ACTION")
    sub.required = True
    size = sub.add_parser("size", help="spares needed: quantile of Binomial(nodes, p)",
                          description="spares needed: quantile of Binomial(nodes, p)")
    size.add_argument("--nodes", type=int, required=True, help="nodes robust jobs use")
    size.add_argument("--failure-prob", type=float, required=True,
                      help="probability that one node fails within the replacement window")
    size.add_argument("--quantile", type=float, default=0.99, help="default 0.99 (P99)")
    size.add_argument("--json", action="store_true", help="machine-readable output")
    for name, text in (("status", "members, spares, target and its basis"),
                       ("reconcile", "fill the reserve to its target, return surplus "
                                     "(idempotent; moves under a lock, never twice; borrows idle "
                                     "train nodes only while the train partitions keep "
                                     "the nodes of the largest queued job)"),
                       ("reset", "put the reserve and train partitions back to their "
                                 "slurm.conf members (after handoffs and reconciles)")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--config", help="site config (default $SLURM_ROBUST_CONFIG or "
                                        "/etc/slurm_robust/config.json)")
        p.add_argument("--target", type=int, help="override the reserve target size")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name in ("reconcile", "reset"):
            p.add_argument("--dry-run", action="store_true",
                           help="plan and log, change nothing (no deep checks run)")
        if name == "reset":
            p.add_argument("--slurm-conf", help="slurm.conf to read the configured members "
                                                "from (default $SLURM_CONF)")


def run(args: argparse.Namespace) -> int:
    if args.reserve_action == "size":
        return _size(args)

    site = load_site_config(args.config)
    cfg = reserve_config(site, target=args.target)
    slurm = Slurm(policy=RetryPolicy(timeout_s=cfg.call_timeout_s))
    # Deep runs happen on each node, through its own slurmd (reserve/remote_check.py).
    gate = SlurmNodeGate(site, slurm)
    if args.reserve_action == "status":
        out = status(slurm, gate, cfg, ledger=SiteLedger(site))
        _print(out, args.json, _status_text)
        return 0
    if args.reserve_action == "reset":
        conf = Path(args.slurm_conf) if args.slurm_conf else slurm_conf_path()
        try:
            text = conf.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {conf}: {exc.strerror}; pass --slurm-conf") \
                from exc
        outcomes = reset(slurm, gate, cfg, text, dry_run=args.dry_run)
        _print({"outcomes": outcomes}, args.json, lambda r: _outcomes_text(r["outcomes"]))
        return 0 if all(o.get("ok") for o in outcomes) else 1
    rep = reconcile(slurm, gate, cfg, dry_run=args.dry_run,
                    breaker=site_breaker(site.breaker), ledger=SiteLedger(site)).as_dict()
    _print(rep, args.json, _reconcile_text)
    return 0 if all(o.get("ok") for o in rep["outcomes"]) else 1


def _size(args: argparse.Namespace) -> int:
    k = binomial_quantile(args.nodes, args.failure_prob, args.quantile)
    out = {"nodes": args.nodes, "failure_prob": args.failure_prob,
           "quantile": args.quantile, "spares": k,
           "cdf_at_spares": binomial_cdf(k, args.nodes, args.failure_prob)}
    _print(out, args.json, lambda o: f"{o['spares']} spares cover P{o['quantile'] * 100:g} of "
                                     f"simultaneous failures of {o['nodes']} nodes at "
                                     f"p={o['failure_prob']:g} (P(X<={o['spares']}) = "
                                     f"{o['cdf_at_spares']:.5f})")
    return 0


def _print(obj: dict[str, Any], as_json: bool, text: Any) -> None:
    print(json.dumps(obj, indent=None, sort_keys=True, default=str) if as_json else text(obj))


def _status_text(s: dict[str, Any]) -> str:
    est = s["sizing"]["estimate"]
    lines = [f"reserve {s['partition']}: {s['spares']} spare(s), target {s['target']} "
             f"(deficit {s['deficit']}); p={est['p']:.5f} from {s['sizing']['estimate_source']}"]
    for m in s["members"]:
        age = "never" if m["deep_pass_age_h"] is None else f"{m['deep_pass_age_h']} h ago"
        why = "spare" if m["spare"] else ("drained: " + m["reason"] if m["drained"] else
                                          "lemon (slurm-robust node lemons)"
                                          if m.get("lemon") else
                                          "busy" if not m["idle"] else "deep pass stale")
        lines.append(f"  {m['node']:<12} {why:<40} deep pass {age}")
    return "\n".join(lines)


def _reconcile_text(r: dict[str, Any]) -> str:
    head = (f"target {r['target']}: spares {','.join(r['spares_before']) or '-'} -> "
            f"{','.join(r['spares_after']) or '-'}")
    return head + "\n" + _outcomes_text(r["outcomes"])


def _outcomes_text(outcomes: list[dict[str, Any]]) -> str:
    lines = []
    for o in outcomes:
        where = f" {','.join(o.get('src', []))} -> {o['dst']}" if o["action"] == "move" else ""
        state = "ok" if o["ok"] else f"FAILED: {o['error']}"
        lines.append(f"  {o['action']} {o['node']}{where} ({o['why']}): {state}")
    if not outcomes:
        lines.append("  nothing to do")
    return "\n".join(lines)
