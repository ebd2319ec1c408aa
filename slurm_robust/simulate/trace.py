"""The incident trace, drawn before the run: common random numbers across what-ifs.

Incidents arrive as a Poisson process in *running time* (seconds the job spends
training), because a fault needs a running job to hit; each lands on a job slot (the
position in the job, whatever machine fills it then). Every random draw an incident may
need (detection, localisation, each failover kind, the recurrence of a
persistent fault) is made here, from one seeded stream, whether or not the run uses it.
So two runs with the same seed and mix see the same faults at the same points of
training with the same durations, and differ only in what this project's code decides
(spares, reserve, rungs). That is what makes "ETTR does not fall as spares grow"
testable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slurm_robust.launcher.control.policy import EVICTING_CLASSES
from slurm_robust.simulate.config import DAY_S, FailureClass, FailureMix, RecoveryTimes
from slurm_robust.simulate.dists import Dist

#: A persistent fault comes back this long (running time, mean) after each restart.
RECUR_MEAN_S = 300.0


@dataclass(frozen=True)
class TraceIncident:
    """One primary fault and every draw it may need."""

    index: int
    run_at: float  # running time of the fault, seconds
    slot: int
    fclass: FailureClass
    detect: float  # nan when the project's own detector decides (hang, fail-slow)
    localise: float
    persistent: bool
    recur_after: tuple[float, ...]  # running-time gaps of successive recurrences
    restart: float
    spare: float
    requeue: float
    resubmit: float
    refill: float
    slow_factor: float  # fail-slow: how much slower the machine's ranks are
    switch: bool  # a switch failure: a block of job slots is lost at once


def _draw(d: Dist | str, rng: np.random.Generator) -> float:
    # The rule-decided times are computed by the job from the real detectors; the draw
    # is still taken so the stream stays aligned across mixes of the same shape.
    x = rng.random()
    if isinstance(d, str):
        return float("nan")
    return d.sample(np.random.default_rng(int(x * 2**63)))


def draw_trace(mix: FailureMix, times: RecoveryTimes, machines: int, days: float,
               seed: int, max_recur: int = 8) -> list[TraceIncident]:
    """Incidents over ``days`` of running time on ``machines`` job slots."""
    rng = np.random.default_rng([seed, 1])
    rate_s = mix.rate_per_machine_day * machines / DAY_S
    horizon = days * DAY_S
    shares = np.array([c.share for c in mix.classes], dtype=float)
    shares /= shares.sum()
    out: list[TraceIncident] = []
    t = 0.0
    refill = times.refill or times.requeue
    while rate_s > 0:
        t += float(rng.exponential(1.0 / rate_s))
        if t >= horizon:
            break
        fc = mix.classes[int(rng.choice(len(shares), p=shares))]
        sub = np.random.default_rng([seed, 2, len(out)])
        out.append(TraceIncident(
            index=len(out), run_at=t, slot=int(rng.integers(machines)), fclass=fc,
            detect=_draw(fc.detect, sub), localise=_draw(fc.localise, sub),
            persistent=bool(sub.random() < fc.persistent),
            recur_after=tuple(float(x) for x in sub.exponential(RECUR_MEAN_S, max_recur)),
            restart=times.restart.sample(sub), spare=times.spare.sample(sub),
            requeue=times.requeue.sample(sub), resubmit=times.resubmit.sample(sub),
            refill=refill.sample(sub), slow_factor=float(sub.uniform(1.6, 3.0)),
            switch=bool(sub.random() < mix.switch_prob) and fc.cls in EVICTING_CLASSES))
    return out
