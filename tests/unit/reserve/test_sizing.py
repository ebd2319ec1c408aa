"""Reserve sizing against an independent binomial computation (exact fractions, Monte Carlo)."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from math import comb

import pytest

from slurm_robust.cli.main import main
from slurm_robust.errors import UsageError
from slurm_robust.reserve.sizing import (
    binomial_cdf,
    binomial_quantile,
    estimate_failure_prob,
    reserve_target,
)


def exact_quantile(n: int, p: float, q: float) -> int:
    """Independent: exact rational arithmetic with math.comb, no logs, no floats."""
    # Decimal meaning of the inputs (0.1 is one tenth), as a user typing them means it.
    pf, qf, total = Fraction(str(p)), Fraction(str(q)), Fraction(0)
    for k in range(n + 1):
        total += comb(n, k) * pf**k * (1 - pf) ** (n - k)
        if total >= qf:
            return k
    return n


@pytest.mark.parametrize(("n", "spares"), [(128, 2), (256, 2), (512, 3), (1024, 4)])
def test_byterobust_table_is_reproduced_at_p_0_0012(n: int, spares: int) -> None:
    assert binomial_quantile(n, 0.0012, 0.99) == spares


# Exact fractions get slow for large n with large p; those corners are left out.
CASES = [(n, p, q) for n in (1, 7, 64, 300, 1000, 2048) for p in (0.0005, 0.0012, 0.01, 0.1)
         for q in (0.9, 0.99, 0.999) if not (n > 1000 and p >= 0.1)]


@pytest.mark.parametrize(("n", "p", "q"), CASES)
def test_quantile_matches_exact_computation(n: int, p: float, q: float) -> None:
    assert binomial_quantile(n, p, q) == exact_quantile(n, p, q)


def test_quantile_agrees_with_monte_carlo() -> None:
    rng = random.Random(7)
    n, p, trials = 200, 0.01, 20000
    draws = sorted(sum(rng.random() < p for _ in range(n)) for _ in range(trials))
    empirical_p99 = draws[int(0.99 * trials)]
    assert abs(binomial_quantile(n, p, 0.99) - empirical_p99) <= 1


def test_cdf_is_monotone_and_reaches_one() -> None:
    values = [binomial_cdf(k, 50, 0.05) for k in range(-1, 52)]
    assert values[0] == 0.0 and values[-1] == 1.0
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))


@pytest.mark.parametrize(("n", "p", "q"), [(-1, 0.1, 0.99), (10, 1.5, 0.99), (10, 0.1, 1.0)])
def test_bad_inputs_are_usage_errors(n: int, p: float, q: float) -> None:
    with pytest.raises(UsageError):
        binomial_quantile(n, p, q)


def test_edges() -> None:
    assert binomial_quantile(0, 0.5) == 0
    assert binomial_quantile(100, 0.0) == 0
    assert binomial_quantile(100, 1.0) == 100


def test_estimate_is_prior_without_history_and_follows_history_with_lots() -> None:
    now = 1_000_000.0
    empty = estimate_failure_prob([], 0, now, 720, 24, 0.0012, 1000)
    assert empty.p == 0.0012 and empty.source == "prior"
    # 100 nodes x 30 windows = 3000 node-windows, 30 failures: 1 % observed.
    times = [now - 3600 * i for i in range(30)]
    est = estimate_failure_prob(times, 100, now, 720, 24, 0.0012, 1000)
    assert est.failures == 30
    assert est.p == pytest.approx((30 + 1.2) / (3000 + 1000))
    old = estimate_failure_prob([now - 721 * 3600], 100, now, 720, 24, 0.0012, 1000)
    assert old.failures == 0  # outside the history window


def test_target_fixed_overrides_and_min_applies() -> None:
    assert reserve_target(4, 0.0012, 0.99, None, 1).size == 1  # computed 0, floor 1
    assert reserve_target(4, 0.0012, 0.99, None, 1).computed == 0
    assert reserve_target(1024, 0.0012, 0.99, None, 1).size == 4
    assert reserve_target(1024, 0.0012, 0.99, 2, 1).size == 2


def test_cli_size_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reserve", "size", "--nodes", "512", "--failure-prob", "0.0012",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spares"] == 3 and out["cdf_at_spares"] >= 0.99


def test_cli_size_rejects_bad_probability(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reserve", "size", "--nodes", "8", "--failure-prob", "2"]) == 2
    assert "failure-prob" in capsys.readouterr().err
