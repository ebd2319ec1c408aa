"""Bounded Prometheus label values, shared by the run's and the reserve's exporters.

A leaf: label values come from closed sets (taxonomy classes, rungs, tiers, partitions);
anything else (free text, a path) must never become a label: it would leak data and
explode the number of series (docs/METRICS.md).
"""

from __future__ import annotations

import re
from typing import Any

_LABEL_OK = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


def label_value(raw: Any) -> str:
    """A bounded label value: a short lower-case identifier, else ``other``."""
    text = str(raw) if raw is not None else "none"
    return text if _LABEL_OK.match(text) else "other"
