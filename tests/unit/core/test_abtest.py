"""The interleaved A/B method: orders, per-round ratios, spread and verdicts."""

from __future__ import annotations

import pytest

from slurm_robust_rehearsal.bench import abtest


def test_round_order_is_a_seeded_shuffle_that_varies_by_round():
    arms = ["a", "b", "c", "d"]
    orders = [abtest.round_order(arms, r, seed=1) for r in range(8)]
    assert all(sorted(o) == arms for o in orders)
    assert len({tuple(o) for o in orders}) > 1          # not the same order every round
    assert orders == [abtest.round_order(arms, r, seed=1) for r in range(8)]  # every rank


def test_ratios_are_per_round_so_a_drift_cancels():
    # The machine slows down 3x over the run; B is 2 % slower than A in every round.
    base = [1.0, 2.0, 3.0]
    arm = [1.02, 2.04, 3.06]
    s = abtest.summarise(base, arm)
    assert s.median == pytest.approx(0.02) and s.min == pytest.approx(0.02)
    assert s.verdict is abtest.Verdict.SLOWER
    d = s.as_dict(target_max=0.02 + 1e-9)
    assert d["met"] and d["met_median"] and d["verdict"] == "slower"


def test_spread_covering_zero_is_within_noise_and_targets_use_median_and_worst():
    s = abtest.summarise([1.0, 1.0, 1.0, 1.0], [0.97, 1.01, 1.05, 1.02])
    assert s.verdict is abtest.Verdict.WITHIN_NOISE
    assert s.min == pytest.approx(-0.03) and s.max == pytest.approx(0.05)
    assert s.q1 <= s.median <= s.q3
    d = s.as_dict(target_max=0.02)
    assert d["met_median"] and not d["met"]  # the worst round is outside the target
    assert abtest.summarise([1.0, 1.0], [0.9, 0.8]).verdict is abtest.Verdict.FASTER


def test_run_rounds_drops_warmup_and_interleaves():
    calls: list[str] = []

    def arm(name: str, value: float):
        def f() -> float:
            calls.append(name)
            return value
        return f

    out = abtest.run_rounds({"a": arm("a", 1.0), "b": arm("b", 1.1)}, rounds=3, warmup=1)
    assert out == {"a": [1.0] * 3, "b": [1.1] * 3}
    assert len(calls) == 8 and all({calls[i], calls[i + 1]} == {"a", "b"}
                                   for i in range(0, 8, 2))
    res = abtest.compare(out, "a", {"b": 0.05})
    assert res["b"]["median"] == pytest.approx(0.1) and res["b"]["met"] is False


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="same positive number"):
        abtest.summarise([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        abtest.summarise([0.0], [1.0])
