"""The side-by-side check against the paper (``slurm-robust simulate --paper-check``).

Four configurations on the same seeds (common random numbers): the project's warm
standby (auto spares, refilled only when the job is requeued or resubmitted, as this
launcher works), the paper's warm standby (spares refilled from the reserve,
``--refill-spares``), requeue only (no spares) and the oracle (unlimited spares). The
failover of machine-evicting incidents (localized to training resumed) stands for the
paper's weighted-average scheduling time; it is averaged over the seeds. Reserve sizes
come from the real :func:`slurm_robust.reserve.sizing.binomial_quantile` at the mix's
machine-evicting rate.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import mean
from typing import Any

from slurm_robust.simulate import paper
from slurm_robust.simulate.engine import SimConfig, auto_spares, simulate
from slurm_robust.simulate.job import UNLIMITED


def _runs(base: SimConfig, seeds: int, **change: Any) -> list[dict[str, Any]]:
    return [simulate(replace(base, run_dir=None, seed=base.seed + i, **change)).summary
            for i in range(seeds)]


def _failover(runs: list[dict[str, Any]]) -> float:
    return mean(r["evicting_failover_mean_s"] or 0.0 for r in runs)


def paper_check(base: SimConfig, seeds: int = 5) -> dict[str, Any]:
    warm = _runs(base, seeds)
    refilled = _runs(base, seeds, refill_spares=True)
    requeue = _runs(base, seeds, spares=0)
    oracle = _runs(base, seeds, spares=UNLIMITED)
    f_warm, f_refill = _failover(warm), _failover(refilled)
    f_requeue, f_oracle = _failover(requeue), _failover(oracle)
    sizes = {n: auto_spares(n, base.mix) for n in paper.TABLE5_SPARES}
    rows = [
        {"check": "warm standby vs requeue (failover of evictions)",
         "paper": f"{paper.WARM_VS_REQUEUE:.2f}x",
         "simulated": f"{f_requeue / f_warm:.2f}x (spares refilled as the paper: "
                      f"{f_requeue / f_refill:.2f}x)"},
        {"check": "warm standby vs unlimited spares",
         "paper": f"{paper.WARM_VS_ORACLE_PCT:.2f} % slower",
         "simulated": f"{100 * (f_warm / f_oracle - 1):.1f} % slower (refilled: "
                      f"{100 * (f_refill / f_oracle - 1):.1f} %)"},
        {"check": "cumulative ETTR", "paper": f"up to {100 * paper.CUMULATIVE_ETTR:.0f} %",
         "simulated": f"{100 * mean(r['ettr'] for r in warm):.2f} % (refilled: "
                      f"{100 * mean(r['ettr'] for r in refilled):.2f} %, requeue only: "
                      f"{100 * mean(r['ettr'] for r in requeue):.2f} %)"},
        {"check": "most unproductive minutes in a 1-hour window",
         "paper": f"at most {paper.MAX_UNPRODUCTIVE_PER_HOUR_MIN:.0f} min",
         "simulated": f"{max(r['max_unproductive_min_per_hour'] for r in warm):.0f} min "
                      f"(1st-percentile window ETTR "
                      f"{100 * mean(r['sliding_ettr_p01'] for r in warm):.1f} %)"},
        {"check": "reserve size for 128/256/512/1,024 machines",
         "paper": "/".join(str(v) for v in paper.TABLE5_SPARES.values()),
         "simulated": "/".join(str(v) for v in sizes.values())},
    ]
    return {"rows": rows, "seeds": seeds, "machines": base.machines, "days": base.days,
            "failover_mean_s": {"warm": f_warm, "warm_refilled": f_refill,
                                "requeue": f_requeue, "oracle": f_oracle},
            "requeues_per_run": {"warm": mean(r["by_rung"]["requeue"] for r in warm),
                                 "warm_refilled": mean(r["by_rung"]["requeue"]
                                                       for r in refilled)},
            "stops_per_run": mean(r["by_rung"]["stop"] for r in warm)}


def markdown(check: dict[str, Any]) -> str:
    head = "| check | paper | simulated |\n|---|---|---|\n"
    return head + "".join(f"| {r['check']} | {r['paper']} | {r['simulated']} |\n"
                          for r in check["rows"])
