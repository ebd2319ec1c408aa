"""Wire the fleet, the reserve and the job on one simpy environment, and run it.

simpy (a process-based discrete-event library) keeps each actor a plain generator: the
job, each evicted machine's drain/check/repair, the reserve's reconcile timer and deep
checks. The cost is linear in events: the engine schedules a handful per incident and
per machine lifecycle; step records are written in bulk per running segment, not as
events.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import simpy

from slurm_robust.reserve.sizing import binomial_quantile
from slurm_robust.simulate.config import DAY_S, FailureMix, RecoveryTimes, evicting_share
from slurm_robust.simulate.eventlog import EventSink
from slurm_robust.simulate.fleet import Fleet, Place
from slurm_robust.simulate.job import UNLIMITED, Job, LadderLimits
from slurm_robust.simulate.metrics import summarize
from slurm_robust.simulate.reserve import Reserve
from slurm_robust.simulate.trace import TraceIncident, draw_trace

QUANTILE = 0.99


@dataclass(frozen=True)
class SimConfig:
    """One simulated run.

    spares: in-job spares; None = auto (binomial P99 of the job's machines at the
        mix's machine-evicting rate, the same sizing as the reserve); -1 = unlimited
        (the paper's oracle).
    reserve: fixed reserve target; None = auto (the real sizing, re-estimated from the
        evictions seen).
    pool: idle machines in the train partition besides the reserve; None = 2 % of the
        job's machines, at least 8.
    refill_spares: refill in-job spares from the reserve as the paper's standby pool is
        (this project's launcher cannot grow a running allocation; see SIMULATOR.md).
    wait_for_nodes: False assumes a requeued job always finds free machines at once.
    trace: replay these incidents instead of drawing them (tests, recorded traces).
    hang_phases: the job declares its phases, so hangs are detected by the learned
        steps limit; False: the single rule of a plain script (simulate/detectors.py).
    """

    machines: int
    days: float
    mix: FailureMix
    times: RecoveryTimes
    gpus_per_machine: int = 8
    spares: int | None = None
    reserve: int | None = None
    pool: int | None = None
    seed: int = 0
    refill_spares: bool = False
    limits: LadderLimits = field(default_factory=LadderLimits)
    wait_for_nodes: bool = True
    run_dir: str | None = None
    trace: tuple[TraceIncident, ...] | None = None
    hang_phases: bool = True


@dataclass
class SimResult:
    config: SimConfig
    summary: dict[str, Any]
    job: Job
    events: int
    records: int
    node_entries: int
    elapsed_s: float


def machine_fail_prob(mix: FailureMix) -> float:
    """Per machine-day probability of a machine-evicting fault under the mix."""
    return min(mix.rate_per_machine_day * evicting_share(mix) / 100.0, 1.0)


def auto_spares(machines: int, mix: FailureMix) -> int:
    return binomial_quantile(machines, machine_fail_prob(mix), QUANTILE)


def simulate(cfg: SimConfig) -> SimResult:
    t0 = time.perf_counter()
    env = simpy.Environment()
    counter = [0]

    def count() -> None:
        counter[0] += 1

    spares = auto_spares(cfg.machines, cfg.mix) if cfg.spares is None else cfg.spares
    fleet = Fleet(env, cfg.times, cfg.seed, count)
    sink = EventSink(cfg.run_dir)
    trace = list(cfg.trace) if cfg.trace is not None else draw_trace(
        cfg.mix, cfg.times, cfg.machines, cfg.days, cfg.seed)
    robust = cfg.machines + max(spares, 0)
    reserve = Reserve(env, fleet, robust, cfg.reserve, machine_fail_prob(cfg.mix), count)
    job = Job(env, fleet, reserve, trace, cfg.machines, spares, cfg.times.step, cfg.limits,
              cfg.refill_spares, sink, count, cfg.wait_for_nodes, cfg.mix.switch_machines,
              cfg.hang_phases)
    pool = max(8, math.ceil(0.02 * cfg.machines)) if cfg.pool is None else cfg.pool
    for _ in range(reserve.target() + pool):
        fleet.add(Place.POOL, 0.0)
    reserve.reconcile()
    reserve.occupancy = [(0.0, reserve.spare_count())]
    env.process(reserve.ticker())
    env.process(job.run())
    end = cfg.days * DAY_S
    env.run(until=end)
    job.finish(end)
    summary = summarize(job.incidents, job.segments, cfg.times.step, end, cfg.machines,
                        job.spare_level, reserve.occupancy)
    if spares == UNLIMITED:
        # The oracle's spares appear from nowhere: they have no cost to count.
        summary["spare_cost_pct"] = summary["spare_machine_days"] = None
    summary.update({
        "machines": cfg.machines, "gpus_per_machine": cfg.gpus_per_machine,
        "days": cfg.days, "seed": cfg.seed, "spares": "unlimited" if spares == UNLIMITED
        else spares, "reserve_target_initial": reserve.occupancy[0][1],
        "reserve_target_final": reserve.target(), "pool": pool,
        "refill_spares": cfg.refill_spares,
        "hang_rule": "phases" if cfg.hang_phases else "single", "spares_used": job.spares_used,
        "handed_over": reserve.handed_over, "handoff_shortfall": reserve.shortfall,
        "machines_deep_checked": fleet.checks, "machines_repaired": fleet.repairs,
        "trace_incidents": len(trace), "failure_mix": cfg.mix.source,
        "recovery_times": cfg.times.source,
        "rate_per_machine_day": cfg.mix.rate_per_machine_day,
        "max_restarts": cfg.limits.max_restarts,
    })
    return SimResult(cfg, summary, job, counter[0], sink.written, sink.node_entries,
                     time.perf_counter() - t0)
