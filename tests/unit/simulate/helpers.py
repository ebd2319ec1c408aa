"""Small traces and configs for the simulator's tests."""

from __future__ import annotations

from dataclasses import replace

from slurm_robust.simulate.config import FailureClass, FailureMix, byterobust_times
from slurm_robust.simulate.dists import fixed
from slurm_robust.simulate.engine import SimConfig
from slurm_robust.simulate.trace import TraceIncident

CRASH = FailureClass("crash", "worker_signal", 1.0, fixed(30.0), fixed(20.0))
GPU = FailureClass("gpu", "gpu_memory_error", 1.0, fixed(10.0), fixed(5.0))
ONE_CLASS = FailureMix(0.0, (CRASH,), "test")


def incident(run_at: float, fclass: FailureClass = CRASH, slot: int = 3, index: int = 0,
             **kw: object) -> TraceIncident:
    base = dict(index=index, run_at=run_at, slot=slot, fclass=fclass,
                detect=float(fclass.detect.a), localise=float(fclass.localise.a),  # type: ignore[union-attr]
                persistent=False, recur_after=(), restart=60.0, spare=70.0, requeue=800.0,
                resubmit=1800.0, refill=800.0, slow_factor=2.0, switch=False)
    base.update(kw)
    return TraceIncident(**base)  # type: ignore[arg-type]


def config(trace: list[TraceIncident], machines: int = 16, days: float = 1.0,
           **kw: object) -> SimConfig:
    times = replace(byterobust_times(machines), step=10.0)
    return SimConfig(machines=machines, days=days, mix=ONE_CLASS, times=times,
                     trace=tuple(trace), **kw)  # type: ignore[arg-type]
