"""The reserve partition under the real sizing and reconcile planning.

The target comes from :func:`slurm_robust.reserve.sizing.reserve_target` (fixed with
``--reserve N``; with ``auto``, the binomial P99 over the robust machines, with the
failure probability re-estimated from the evictions seen so far by the real
:func:`~slurm_robust.reserve.sizing.estimate_failure_prob`). Each reconcile builds a
:class:`~slurm_robust.reserve.plan.Snapshot` of the reserve members and the idle pool
(the job's busy machines are never candidates, so they are left out to keep it small),
asks :func:`~slurm_robust.reserve.plan.plan_reconcile` what to do, and applies it: deep
checks take ``RecoveryTimes.deep_check`` and trigger another reconcile when done. A
requeue hands spares to the job through :func:`~slurm_robust.reserve.plan.plan_handoff`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import simpy

from slurm_robust.reserve.config import HOUR_S, ReserveConfig
from slurm_robust.reserve.plan import NodeView, Snapshot, plan_handoff, plan_reconcile, spares
from slurm_robust.reserve.sizing import estimate_failure_prob, reserve_target
from slurm_robust.reserve.verdicts import Verdict
from slurm_robust.simulate.fleet import Fleet, Place

#: Reconcile runs at least this often (the site timer), and after every change.
RECONCILE_EVERY_S = HOUR_S
STANDBY, TRAIN = "standby", "train"


class Reserve:
    """The standby partition of the simulated fleet."""

    def __init__(self, env: simpy.Environment, fleet: Fleet, robust_nodes: int,
                 fixed: int | None, prior: float, count: Callable[[], None]) -> None:
        self.env = env
        self.fleet = fleet
        self.cfg = ReserveConfig(partition=STANDBY, train_partitions=(TRAIN,), target=fixed,
                                 robust_nodes=robust_nodes, failure_prob_prior=prior,
                                 base_dir="/nonexistent/simulated")
        self.members: dict[int, None] = {}
        self.evictions: list[float] = []
        self.blocked = False  # a pending job has first claim on idle machines
        self.count = count
        self.checking: set[int] = set()
        self.occupancy: list[tuple[float, int]] = [(0.0, 0)]
        self.handed_over = 0
        self.shortfall = 0

    def target(self) -> int:
        c = self.cfg
        if c.target is not None:
            return c.target
        est = estimate_failure_prob(self.evictions, c.robust_nodes or 0, self.env.now,
                                    c.history_h, c.replacement_window_h,
                                    c.failure_prob_prior, c.prior_weight)
        return reserve_target(c.robust_nodes or 0, est.p, c.quantile, None,
                              c.min_target).size

    def snapshot(self) -> Snapshot:
        f = self.fleet
        names: dict[str, NodeView] = {}
        for m in (*self.members, *f.pool):
            idle = f.place[m] in (Place.POOL, Place.STANDBY)
            names[f.name(m)] = NodeView(f.name(m), idle, False, True, "", f.last_deep_pass[m])
        return Snapshot(self.env.now, names,
                        {STANDBY: tuple(f.name(m) for m in self.members),
                         TRAIN: tuple(f.name(m) for m in f.pool)})

    def spare_count(self) -> int:
        return len(spares(self.snapshot(), self.cfg))

    def _record(self, snap: Snapshot | None = None) -> None:
        n = len(spares(snap or self.snapshot(), self.cfg))
        if self.occupancy[-1][1] != n:
            self.occupancy.append((self.env.now, n))

    def reconcile(self) -> None:
        """One pass of the real planner; deep checks re-trigger a pass when done."""
        if self.blocked:
            return
        self.count()
        snap = self.snapshot()
        actions = plan_reconcile(snap, self.cfg, self.target(),
                                 frozenset(self.fleet.name(m) for m in self.checking))
        if not actions:
            self._record(snap)
            return
        for a in actions:
            m = self.fleet.index(a.node)
            if a.kind == "deep_check":
                if m not in self.checking:
                    self.checking.add(m)
                    self.env.process(self._check(m))
            elif a.kind == "move" and a.dst == STANDBY:
                self.fleet.move(m, Place.STANDBY)
                self.members[m] = None
            elif a.kind == "move":
                self.members.pop(m, None)
                self.fleet.move(m, Place.POOL)
        self._record()

    def _check(self, m: int) -> Generator[Any, Any, None]:
        yield self.fleet.recheck(m)
        self.checking.discard(m)
        self.reconcile()

    def ticker(self) -> Generator[Any, Any, None]:
        while True:
            self.reconcile()
            yield self.env.timeout(RECONCILE_EVERY_S)

    def take_one(self) -> int | None:
        """A spare for an in-job refill (``--refill-spares``), freshest first."""
        avail = spares(self.snapshot(), self.cfg)
        if not avail:
            return None
        m = self.fleet.index(avail[0])
        self.members.pop(m, None)
        self.fleet.move(m, Place.JOB)
        self._record()
        return m

    def handoff(self, job_id: str, lost: list[int]) -> None:
        """A requeued job lost ``lost``: the real handoff plan moves spares to its
        partition (the drains are the fleet's evictions, already under way)."""
        verdicts = [Verdict(job_id, self.fleet.name(m), "simulated eviction", "node_lost",
                            "", {}) for m in lost]
        plan = plan_handoff(job_id, TRAIN, True, verdicts, self.snapshot(), self.cfg, {})
        for a in plan.actions:
            if a.kind == "move":
                m = self.fleet.index(a.node)
                self.members.pop(m, None)
                self.fleet.move(m, Place.POOL)
                self.handed_over += 1
        self.shortfall += plan.shortfall
        self._record()
