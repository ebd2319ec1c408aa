"""Machines outside the job: the idle pool, drain, deep check, repair.

A machine is in one place at a time (:class:`Place`). An evicted machine is drained,
deep-checked (``RecoveryTimes.deep_check``), and returns to the idle pool with a fresh
deep pass, or goes to repair first (``deep_check_fail``, ``repair``). The reserve
(:mod:`.reserve`) moves machines between the pool and the standby partition; the job
takes machines from the pool when it is (re)scheduled.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy

from slurm_robust.simulate.config import RecoveryTimes


class Place(enum.Enum):
    JOB = "job"  # active in the job, or an in-job spare
    POOL = "pool"  # idle in the train partition
    STANDBY = "standby"  # a reserve member
    CHECK = "check"  # drained or stale, deep suite running
    REPAIR = "repair"  # failed its deep check


class Fleet:
    """Where every machine is, and the lifecycle processes of evicted ones."""

    def __init__(self, env: simpy.Environment, times: RecoveryTimes, seed: int,
                 count: Callable[[], None]) -> None:
        self.env = env
        self.times = times
        self.seed = seed
        self.place: list[Place] = []
        self.names: list[str] = []  # cached: names are looked up per incident and record
        self.last_deep_pass: list[float | None] = []
        self.pool: dict[int, None] = {}  # insertion-ordered set of idle pool machines
        self.changed = env.event()
        self.count = count
        self.repairs = 0
        self.checks = 0
        self.draws: dict[int, int] = {}  # machine -> lifecycle draws so far

    def add(self, place: Place, fresh_at: float | None = 0.0) -> int:
        m = len(self.place)
        self.place.append(place)
        self.names.append(f"m{m:05d}")
        self.last_deep_pass.append(fresh_at)
        if place is Place.POOL:
            self.pool[m] = None
        return m

    def name(self, m: int) -> str:
        return self.names[m]

    @staticmethod
    def index(name: str) -> int:
        return int(name[1:])

    def move(self, m: int, place: Place) -> None:
        if self.place[m] is Place.POOL:
            self.pool.pop(m, None)
        self.place[m] = place
        if place is Place.POOL:
            self.pool[m] = None
            self._notify()

    def _notify(self) -> None:
        ev, self.changed = self.changed, self.env.event()
        ev.succeed()

    def take_from_pool(self, n: int) -> list[int]:
        got = list(self.pool)[:n]
        for m in got:
            self.move(m, Place.JOB)
        return got

    def evict(self, m: int) -> None:
        """Drain ``m`` and start its deep check (then pool, or repair then pool)."""
        self.move(m, Place.CHECK)
        self.env.process(self._lifecycle(m))

    def _rng(self, m: int) -> np.random.Generator:
        # One stream per machine and lifecycle: the n-th check of machine m draws the
        # same numbers in every what-if, whatever else happened in between.
        n = self.draws[m] = self.draws.get(m, 0) + 1
        return np.random.default_rng([self.seed, 3, m, n])

    def _lifecycle(self, m: int) -> Generator[Any, Any, None]:
        self.checks += 1
        self.count()
        rng = self._rng(m)
        yield self.env.timeout(self.times.deep_check.sample(rng))
        if rng.random() < self.times.deep_check_fail:
            self.repairs += 1
            self.move(m, Place.REPAIR)
            self.count()
            yield self.env.timeout(self.times.repair.sample(rng))
        # A repaired machine passes the deep suite before it is returned.
        self.last_deep_pass[m] = self.env.now
        self.move(m, Place.POOL)

    def recheck(self, m: int) -> simpy.Process:
        """A reserve-requested deep check of an idle machine (it passes: it was idle and
        healthy; the failure mix puts faults on machines in use)."""
        return self.env.process(self._recheck(m))

    def _recheck(self, m: int) -> Generator[Any, Any, None]:
        back = self.place[m]
        self.move(m, Place.CHECK)
        self.count()
        yield self.env.timeout(self.times.deep_check.sample(self._rng(m)))
        self.last_deep_pass[m] = self.env.now
        self.move(m, back)
