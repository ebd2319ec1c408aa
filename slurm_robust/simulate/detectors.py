"""Detection and localisation times decided by this project's own detectors.

- Hangs: the launcher's limit for steady steps. A job that declares its phases (the
  training API's sections, the Lightning and Hugging Face callbacks) gets the learned
  steps limit of :mod:`slurm_robust.launcher.control.phases` (max(3 s, 5 x p95 step));
  one that does not, the single rule
  (:func:`slurm_robust.launcher.control.policy.hang_timeout` with the launcher's default
  floor and factor). A simulated step never varies, so its p95 is the step time.
- Fail-slow: the real :class:`~slurm_robust.stacks.failslow.FailSlowMonitor` is fed one
  busy time per machine per round (the slow machine's ranks ``slow_factor`` times
  slower) until its vote names a group; detection is the first round, localisation the
  rounds after it, and the named machines are the ones the ladder is asked to evict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.phases import STEPS, limit_of
from slurm_robust.launcher.control.policy import WINDOW, hang_timeout
from slurm_robust.layout import ParallelLayout
from slurm_robust.stacks.failslow import FailSlowMonitor, FailSlowOptions

#: Rounds after which a vote that names nobody gives up (the fault is then handled as
#: a plain restart of an unclear failure).
MAX_ROUNDS = 60


def launch_default(name: str) -> object:
    """A RunConfig field's default (RunConfig itself needs a command to build)."""
    return next(f.default for f in fields(RunConfig) if f.name == name)


def hang_detection_s(step_s: float, phases: bool = True) -> float:
    """Seconds from a stopped step to the hang being declared (``phases``: the job
    declares its phases, see the module docstring)."""
    if phases:
        return limit_of(STEPS, {STEPS: [step_s] * WINDOW}, {}, 0.0)
    floor = float(launch_default("hang_floor_s"))  # type: ignore[arg-type]
    factor = float(launch_default("hang_factor"))  # type: ignore[arg-type]
    return hang_timeout([step_s] * WINDOW, floor, factor)


def fail_slow_vote(nodes: Sequence[str], slow: int, slow_factor: float,
                   step_s: float) -> tuple[float, float, tuple[str, ...]]:
    """(detection s, localisation s, nodes named) for machine ``nodes[slow]`` running
    ``slow_factor`` times slower; ``()`` named when the vote never decides."""
    layout = ParallelLayout(dp=len(nodes), ranks_per_node=1, node_names=tuple(nodes))
    share = max(FailSlowOptions.max_slow_fraction, min(0.5, 1.5 / len(nodes)))
    opts = FailSlowOptions(
        interval_s=float(launch_default("fail_slow_interval_s")),  # type: ignore[arg-type]
        window=int(launch_default("fail_slow_window")),  # type: ignore[call-overload]
        min_votes=int(launch_default("fail_slow_min_votes")),  # type: ignore[call-overload]
        slow_factor=float(launch_default("fail_slow_factor")),  # type: ignore[arg-type]
        min_excess_s=float(launch_default("fail_slow_min_excess_s")),  # type: ignore[arg-type]
        max_slow_fraction=share)
    mon = FailSlowMonitor(layout, opts)
    now = 0.0
    for rnd in range(1, MAX_ROUNDS + 1):
        for rank in range(len(nodes)):
            mon.record(rank, step_s * (slow_factor if rank == slow else 1.0), now)
        now += opts.interval_s
        decision = mon.poll(now)
        if decision is not None:
            return opts.interval_s, (rnd - 1) * opts.interval_s, decision.eviction.nodes
    return opts.interval_s, (MAX_ROUNDS - 1) * opts.interval_s, ()
