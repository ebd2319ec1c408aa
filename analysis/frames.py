"""Turn lists of JSON records into typed DataFrames, counting the records that do not fit.

A column spec names each field's kind; a record whose *required* field is missing or of
the wrong type is counted as invalid (with an example) and left out of the frame, never
dropped silently. Optional fields become nulls. Everything here is pure (no I/O).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# Column kinds: "float", "metric" (a float that may be spelled "nan"/"inf"/"-inf", as the
# launcher writes a non-finite loss), "int" (nullable Int64 unless required), "str", "category",
# "bool", "list" (Python list of str, object column), "object" (kept as is).
ColumnSpec = Mapping[str, tuple[str, bool]]

MAX_EXAMPLES = 5


@dataclass
class LoadIssues:
    """What could not be read: counts per source and a few examples to look at."""

    malformed_lines: dict[str, int] = field(default_factory=dict)
    invalid_records: dict[str, int] = field(default_factory=dict)
    unknown_events: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, bucket: dict[str, int], key: str, count: int, example: str = "") -> None:
        if count <= 0:
            return
        bucket[key] = bucket.get(key, 0) + count
        if example and len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example)

    def merge(self, other: LoadIssues) -> None:
        for mine, theirs in ((self.malformed_lines, other.malformed_lines),
                             (self.invalid_records, other.invalid_records),
                             (self.unknown_events, other.unknown_events)):
            for key, count in theirs.items():
                mine[key] = mine.get(key, 0) + count
        room = MAX_EXAMPLES - len(self.examples)
        self.examples.extend(other.examples[:max(room, 0)])

    @property
    def total(self) -> int:
        """Lines and records that were not analysed (unknown event types excluded)."""
        return sum(self.malformed_lines.values()) + sum(self.invalid_records.values())

    def as_dict(self) -> dict[str, Any]:
        return {"malformed_lines": dict(self.malformed_lines),
                "invalid_records": dict(self.invalid_records),
                "unknown_events": dict(self.unknown_events),
                "examples": list(self.examples), "total": self.total}


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _is_int(value: Any) -> bool:
    return _is_number(value) and float(value).is_integer()


NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _is_metric(value: Any) -> bool:
    return _is_number(value) or (isinstance(value, str) and value.lower() in NONFINITE)


_CHECKS = {
    "float": _is_number,
    "metric": _is_metric,
    "int": _is_int,
    "str": lambda v: isinstance(v, str),
    "category": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "object": lambda v: True,
}


def records_to_frame(records: Sequence[Mapping[str, Any]], spec: ColumnSpec,
                     categories: Mapping[str, Sequence[str]] | None = None,
                     ) -> tuple[pd.DataFrame, np.ndarray]:
    """Build a typed frame from ``records``; returns (frame of valid rows, invalid mask).

    ``categories`` fixes the categories of "category" columns (values outside them are
    added after the fixed ones, so nothing is lost to NaN).
    """
    n = len(records)
    invalid = np.zeros(n, dtype=bool)
    raw: dict[str, list[Any]] = {}
    for col, (kind, required) in spec.items():
        check = _CHECKS[kind]
        values = [r.get(col) for r in records]
        ok = np.fromiter((v is None or check(v) for v in values), dtype=bool, count=n)
        present = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        bad = ~ok | (~present if required else False)
        invalid |= bad
        raw[col] = values
    keep = ~invalid
    cols = {col: _column([v for v, k in zip(raw[col], keep, strict=True) if k], kind,
                         required, (categories or {}).get(col))
            for col, (kind, required) in spec.items()}
    return pd.DataFrame(cols, index=pd.RangeIndex(int(keep.sum()))), invalid


def _column(values: list[Any], kind: str, required: bool,
            fixed: Sequence[str] | None) -> pd.Series:
    if kind == "float":
        return pd.Series(np.array([np.nan if v is None else v for v in values],
                                  dtype=np.float64))
    if kind == "metric":
        return pd.Series(np.array([np.nan if v is None else
                                   NONFINITE[v.lower()] if isinstance(v, str) else v
                                   for v in values], dtype=np.float64))
    if kind == "int":
        if required:
            return pd.Series(np.array(values, dtype=np.int64))
        return pd.Series(values, dtype="Int64")
    if kind == "str":
        return pd.Series(values, dtype="string")
    if kind == "category":
        return as_category(pd.Series(values, dtype=object), fixed)
    if kind == "bool":
        return pd.Series(values, dtype="boolean")
    return pd.Series(values, dtype=object)


def as_category(series: pd.Series, fixed: Sequence[str] | None = None) -> pd.Series:
    """A categorical with ``fixed`` categories first, then any others seen, sorted."""
    seen = pd.unique(series.dropna())
    cats = list(fixed or [])
    cats += sorted(str(v) for v in seen if v not in set(cats))
    return pd.Series(pd.Categorical(series, categories=cats), index=series.index)


def empty_frame(spec: ColumnSpec,
                categories: Mapping[str, Sequence[str]] | None = None) -> pd.DataFrame:
    """A zero-row frame with the dtypes :func:`records_to_frame` would give."""
    return records_to_frame([], spec, categories)[0]
