"""Slurm hostlist expressions (``node[1-3,5],spare1``), expanded and compressed in pure Python.

Used on hot paths (prolog, epilog) where calling ``scontrol show hostnames`` would cost a
process start; tests check both against the real scontrol.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from slurm_robust.errors import UsageError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"bad hostlist {expr!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise UsageError(f"bad hostlist {expr!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_one(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1:end], item[end + 1:]
    out: list[str] = []
    for rng in body.split(","):
        m = _RANGE.match(rng.strip())
        if not m:
            raise UsageError(f"bad hostlist range {rng!r} in {item!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo)
        if int(hi) < int(lo):
            raise UsageError(f"bad hostlist range {rng!r}: end before start")
        for n in range(int(lo), int(hi) + 1):
            for tail in _expand_one(rest):
                out.append(f"{prefix}{n:0{width}d}{tail}")
    return out


def expand_hostlist(expr: str) -> list[str]:
    """``node[1-2],spare1`` -> ``['node1', 'node2', 'spare1']`` (order kept, no dedup)."""
    if not expr or expr.strip() in ("", "(null)"):
        return []
    out: list[str] = []
    for item in _split_top(expr):
        out.extend(_expand_one(item))
    return out


_TAIL_NUM = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(names: Iterable[str]) -> str:
    """The inverse of :func:`expand_hostlist` for simple ``prefix<number>`` names."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in names:
        m = _TAIL_NUM.match(name)
        if not m:
            if name not in plain:
                plain.append(name)
                order.append(name)
            continue
        key = (m.group(1), len(m.group(2)) if m.group(2).startswith("0") else 0)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(2)))
    parts: list[str] = []
    for key in order:
        if isinstance(key, str):
            parts.append(key)
            continue
        prefix, width = key
        nums = sorted(set(groups[key]))
        ranges: list[str] = []
        lo = prev = nums[0]
        for n in nums[1:] + [None]:  # type: ignore[list-item]
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(f"{lo:0{width}d}" if lo == prev else f"{lo:0{width}d}-{prev:0{width}d}")
            if n is not None:
                lo = prev = n
        if len(nums) == 1:
            parts.append(f"{prefix}{nums[0]:0{width}d}")
        else:
            parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(parts)
