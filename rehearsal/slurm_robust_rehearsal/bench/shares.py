"""Shares and how the classifier benchmarks print them: one rounding, one format, for the
figures the docs quote (bench classify's headline and its reviewers' line)."""

from __future__ import annotations


def share(hits: int, n: int) -> float | None:
    """hits / n to 4 decimals; None for no entries (a figure of nothing, not 0)."""
    return round(hits / n, 4) if n else None


def percent(value: float | None) -> str:
    """A share as the docs write it ("75.7 %"), "-" for None."""
    return "-" if value is None else f"{100 * value:.1f} %"
