"""What-if sweeps for admins: ETTR and spare cost against spares, requeue delay, rungs.

Every point reruns the same seeds, so all points see the same faults (common random
numbers, see :mod:`.trace`) and differences come from the setting alone; each row is the
mean over ``seeds`` seeds, because rare events (a switch failure while the idle pool is
short) move a single run a lot. The result is one table (rows as dicts;
:func:`markdown` renders it) and one plot (:func:`plot`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from statistics import mean
from typing import Any

from slurm_robust.simulate.dists import Dist
from slurm_robust.simulate.engine import SimConfig, auto_spares, simulate
from slurm_robust.simulate.job import UNLIMITED

REQUEUE_FACTORS = (0.5, 1.0, 2.0, 4.0)


def _row(sweep: str, value: str, cfg: SimConfig, seeds: int) -> dict[str, Any]:
    runs = [simulate(replace(cfg, seed=cfg.seed + i)).summary for i in range(seeds)]
    failover = [s["evicting_failover_mean_s"] for s in runs
                if s["evicting_failover_mean_s"] is not None]
    return {"sweep": sweep, "value": value, "seeds": seeds,
            "ettr": round(mean(s["ettr"] for s in runs), 5),
            "spare_cost_pct": None if runs[0]["spare_cost_pct"] is None
            else round(mean(s["spare_cost_pct"] for s in runs), 3),
            "requeues": round(mean(s["by_rung"]["requeue"] for s in runs), 1),
            "stops": round(mean(s["by_rung"]["stop"] for s in runs), 1),
            "evicting_failover_mean_s": round(mean(failover), 1) if failover else None}


def run_sweeps(base: SimConfig, seeds: int = 3) -> list[dict[str, Any]]:
    base = replace(base, run_dir=None)
    auto = auto_spares(base.machines, base.mix)
    rows = []
    for k in sorted({0, 1, 2, auto, 2 * auto, 4 * auto}):
        rows.append(_row("spares", str(k), replace(base, spares=k), seeds))
    rows.append(_row("spares", "unlimited", replace(base, spares=UNLIMITED), seeds))
    for f in REQUEUE_FACTORS:
        t = base.times
        times = replace(t, requeue=Dist(t.requeue.kind, t.requeue.a * f, t.requeue.b * f,
                                        tuple(v * f for v in t.requeue.values)))
        rows.append(_row("requeue_delay", f"x{f:g}", replace(base, times=times), seeds))
    rows.append(_row("rungs", "all", base, seeds))
    rows.append(_row("rungs", "no spare", replace(base, spares=0), seeds))
    rows.append(_row("rungs", "no requeue (unlimited spares)", replace(base, spares=UNLIMITED),
                     seeds))
    rows.append(_row("rungs", "no stop (unlimited restarts)",
                     replace(base, limits=replace(base.limits, max_restarts=10**9,
                                                  max_no_progress=10**9)), seeds))
    rows.append(_row("rungs", "spares refilled (paper)", replace(base, refill_spares=True),
                     seeds))
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| sweep | value | ETTR | spare cost (% of job machine-time) | requeues | stops "
            "| mean failover of evictions (s) |\n|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['sweep']} | {r['value']} | {100 * r['ettr']:.2f} % | {_num(r['spare_cost_pct'])} "
        f"| {r['requeues']} | {r['stops']} | {r['evicting_failover_mean_s']} |\n" for r in rows)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def plot(rows: list[dict[str, Any]], path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = list(dict.fromkeys(r["sweep"] for r in rows))
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4))
    for ax, name in zip(axes, sweeps, strict=True):
        sub = [r for r in rows if r["sweep"] == name]
        labels = [r["value"] for r in sub]
        ax.bar(range(len(sub)), [100 * r["ettr"] for r in sub], color="tab:blue")
        ax.set_xticks(range(len(sub)), labels, rotation=30, ha="right", fontsize=8)
        lo = min(100 * r["ettr"] for r in sub)
        ax.set_ylim(max(lo - 1.0, 0), 100)
        ax.set_ylabel("cumulative ETTR (%)")
        ax.set_title(name)
        cost = ax.twinx()
        cost.plot(range(len(sub)), [float("nan") if r["spare_cost_pct"] is None
                                    else r["spare_cost_pct"] for r in sub], "o-",
                  color="tab:red")
        cost.set_ylabel("spare cost (% of job machine-time)", color="tab:red")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
