"""Fail-slow voting on per-rank busy times (synthetic timings, injected clock)."""

from __future__ import annotations

import random

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.layout import parse_layout
from slurm_robust.stacks.failslow import (
    FailSlowMonitor,
    FailSlowOptions,
    RoundResult,
    flag_round,
    vote,
)
from slurm_robust.stacks.groups import select_eviction

LAYOUT = parse_layout("tp=2,pp=2,dp=4", ranks_per_node=2)  # 16 ranks on 8 machines


def _feed(monitor: FailSlowMonitor, rounds: int, slow: dict[int, float], seed: int = 0,
          base: float = 0.1, step_s: float = 0.5, uniform: float = 1.0) -> list:
    """Simulate steps every ``step_s`` for ``rounds`` intervals; returns decisions."""
    rng = random.Random(seed)
    decisions = []
    now = 0.0
    per_round = int(monitor.options.interval_s / step_s)
    for _ in range(rounds):
        for _ in range(per_round):
            now += step_s
            for rank in range(LAYOUT.world_size):
                busy = base * uniform * slow.get(rank, 1.0) * rng.uniform(0.9, 1.1)
                monitor.record(rank, busy, now)
            decision = monitor.poll(now)
            if decision is not None:
                decisions.append((len(monitor.rounds), now, decision))
    return decisions


def test_one_rank_slowed_2x_is_named_within_5_rounds():
    monitor = FailSlowMonitor(LAYOUT)
    decisions = _feed(monitor, rounds=5, slow={5: 2.0})
    assert len(decisions) == 1
    _, when, decision = decisions[0]
    assert when <= 5 * monitor.options.interval_s
    assert decision.eviction.dim == "pp"
    assert 5 in decision.eviction.ranks
    assert decision.eviction.nodes == tuple(LAYOUT.nodes_of(LAYOUT.group(5, "pp")))
    assert max(decision.votes.values()) >= monitor.options.min_votes
    assert all(r.slow_ranks == (5,) for r in decision.rounds)


def test_uniform_slowness_names_nothing():
    monitor = FailSlowMonitor(LAYOUT)
    assert _feed(monitor, rounds=12, slow={}, uniform=2.0) == []
    assert all(r.flagged is None for r in monitor.rounds)


def test_a_slow_machine_names_its_group():
    # Both ranks of machine 2 (ranks 4 and 5, a TP group) run 1.8x slower.
    monitor = FailSlowMonitor(LAYOUT)
    (_, _, decision), = _feed(monitor, rounds=5, slow={4: 1.8, 5: 1.8})
    assert decision.eviction.dim == "tp"
    assert decision.eviction.nodes == ("node2",)


def test_jitter_below_the_threshold_names_nothing():
    monitor = FailSlowMonitor(LAYOUT, FailSlowOptions(slow_factor=1.5))
    assert _feed(monitor, rounds=10, slow={3: 1.3}, seed=4) == []


def test_thresholds_are_configurable():
    # 1.4x is under the default factor (1.5) but over a configured 1.25.
    assert _feed(FailSlowMonitor(LAYOUT), rounds=8, slow={3: 1.4}) == []
    monitor = FailSlowMonitor(LAYOUT, FailSlowOptions(interval_s=2.0, slow_factor=1.25,
                                                      min_votes=5, window=5),
                              started=0.0)
    decisions = _feed(monitor, rounds=5, slow={3: 1.4})
    assert len(decisions) == 1 and 3 in decisions[0][2].eviction.ranks
    assert decisions[0][1] == pytest.approx(10.0)  # the 5th round: all 5 votes needed


def test_vote_needs_enough_flags_and_a_clear_winner():
    opts = FailSlowOptions()
    a = select_eviction([1], LAYOUT)
    b = select_eviction([2], LAYOUT)
    flag = lambda ev: RoundResult(0.0, 16, 0.1, (), ev)  # noqa: E731
    assert vote([flag(a), flag(a), flag(None)], opts) is None  # 2 < min_votes 3
    assert vote([flag(a), flag(a), flag(b), flag(b), flag(b)], opts).eviction == b
    assert vote([flag(a)] * 3 + [flag(b)] * 3, FailSlowOptions(window=6)) is None  # tie


def test_round_with_too_few_reports_or_too_many_slow_ranks_flags_nothing():
    opts = FailSlowOptions()
    few = flag_round({0: 0.1, 1: 0.5}, LAYOUT, opts)
    assert few.flagged is None and "reported" in few.note
    busy = {r: (0.3 if r < 6 else 0.1) for r in range(16)}
    many = flag_round(busy, LAYOUT, opts)
    assert many.flagged is None and "too many" in many.note


@pytest.mark.parametrize("kwargs", [{"slow_factor": 1.0}, {"min_votes": 6},
                                    {"interval_s": 0}, {"max_slow_fraction": 1.5}])
def test_bad_options_are_refused(kwargs):
    with pytest.raises(UsageError):
        FailSlowOptions(**kwargs)


def test_jitter_below_the_minimum_excess_is_not_slow():
    # Busy medians of 27-54 ms round to round on a loaded 2-core host: one rank at 1.8x
    # the median by 25 ms is scheduler noise, not a slow machine.
    busy = {r: 0.03 for r in range(LAYOUT.world_size)}
    busy[5] = 0.055
    assert flag_round(busy, LAYOUT, FailSlowOptions()).slow_ranks == (5,)
    quiet = flag_round(busy, LAYOUT, FailSlowOptions(min_excess_s=0.05))
    assert quiet.slow_ranks == () and quiet.flagged is None
    busy[5] = 0.09  # 60 ms above: slow whatever the step
    assert flag_round(busy, LAYOUT, FailSlowOptions(min_excess_s=0.05)).slow_ranks == (5,)
    with pytest.raises(UsageError, match="min_excess_s"):
        FailSlowOptions(min_excess_s=-0.01)


def test_each_ranks_first_samples_are_warm_up():
    # A generation's first steps: one rank compiling 10x longer than the others.
    mon = FailSlowMonitor(LAYOUT, FailSlowOptions(interval_s=1.0, window=1, min_votes=1,
                                                  warmup_samples=2))
    now = 0.0
    for _ in range(2):
        for rank in range(LAYOUT.world_size):
            mon.record(rank, 1.0 if rank == 3 else 0.1, now)
        now += 0.6
    assert mon.started is None and mon.poll(now) is None
    for _ in range(2):
        for rank in range(LAYOUT.world_size):
            mon.record(rank, 0.1, now)
        now += 0.6
    assert mon.poll(now) is None and mon.rounds[-1].slow_ranks == ()
    with pytest.raises(UsageError, match="warmup_samples"):
        FailSlowOptions(warmup_samples=-1)
