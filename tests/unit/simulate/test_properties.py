"""Properties over random seeds: ETTR is a ratio, and with common random numbers more
spares never lower it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_robust.simulate.config import byterobust_mix, byterobust_times
from slurm_robust.simulate.engine import SimConfig, simulate
from slurm_robust.simulate.job import UNLIMITED

# Switch failures evict 32 machines at once; every other fault blames at most one
# machine, and with fixed failover times and free machines on requeue the ladder's
# requeues can only become rarer as spares grow (see docs/SIMULATOR.md).
MIX = replace(byterobust_mix(), switch_prob=0.0, rate_per_machine_day=0.02)
TIMES = byterobust_times(200)


def _ettr(seed: int, spares: int) -> float:
    cfg = SimConfig(machines=200, days=20, mix=MIX, times=TIMES, seed=seed, spares=spares,
                    wait_for_nodes=False)
    return simulate(cfg).summary["ettr"]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), spares=st.integers(0, 6))
def test_ettr_is_a_ratio(seed: int, spares: int) -> None:
    assert 0.0 <= _ettr(seed, spares) <= 1.0


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), low=st.integers(0, 4), more=st.integers(1, 4))
def test_ettr_does_not_fall_as_spares_grow(seed: int, low: int, more: int) -> None:
    a, b, oracle = _ettr(seed, low), _ettr(seed, low + more), _ettr(seed, UNLIMITED)
    assert a <= b + 1e-12
    assert b <= oracle + 1e-12


def test_spares_matter_on_this_mix() -> None:
    # Guards the property above against being vacuous: spares do change the outcome.
    assert _ettr(0, 0) < _ettr(0, 5)
