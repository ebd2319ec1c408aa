"""The node of every rank, written compactly: runs of numbered nodes with their ranks.

A plan names the node of each rank of the world (``Plan.rank_nodes``), and every worker
gets the same list in its environment (``SLURM_ROBUST_RANK_NODES``). Written out name by
name that is 32,768 names at 4,096 nodes of 8 ranks: about 400 KB of JSON in every full
reply, and an environment string three times Linux's limit for one (MAX_ARG_STRLEN,
128 KiB: ``execve`` then fails with E2BIG and no worker starts; with 25-character host
names the list passes it already at 1,024 nodes). Ranks are placed a node at a time and
nodes are numbered, so the list is a few runs: ``[["node[0001-4096]", 8]]`` says that
node0001 holds ranks 0-7, node0002 ranks 8-15, and so on; a spare that took a node's
place splits the run in three.

The form: a JSON list of ``[nodes, ranks_per_node]`` pairs in rank order, ``nodes``
either one node name or ``prefix[first-last]suffix`` (Slurm's hostlist notation,
restricted to one ascending range whose bounds have the same number of digits, which is
every node's: node0009 and node0010, not node9 and node10). The order of the ranks is
kept exactly, which a sorting hostlist library (python-hostlist's ``collect_hostlist``,
the project's own ``slurm.hostlist.compress_hostlist``, which groups by prefix) does not
do, so a run is only made of nodes that follow each other in rank order; and a map is
expanded only after its one range is checked and its size bounded, which
``expand_hostlist`` (commas, nested ranges, no bound) does not do.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

#: The most ranks a map may expand to: far above any job (4,096 x 8 = 32,768), low enough
#: that a malformed map cannot make a reader build a list of billions.
MAX_RANKS = 1 << 20
_last_lock = threading.Lock()
#: The last rank map decoded, whole: every plan of a generation carries the same one (an
#: agent gets it again on a reconnect; the scale bench's process, 4,096 times).
MAX_KEPT_RANKS = 1 << 16
_last: dict[tuple[tuple[str, int], ...], tuple[str, ...]] = {}

_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")
_RANGE = re.compile(r"^([^\[\]]*)\[(\d+)-(\d+)\]([^\[\]]*)$")


class RankMapError(ValueError):
    """A rank map that cannot be read (malformed, or too large)."""


def encode(rank_nodes: Sequence[str]) -> list[list[Any]]:
    """The compact runs of ``rank_nodes`` (see the module docstring); ``decode`` gives
    the list back exactly."""
    # First the node of each consecutive block of ranks, with the block's size.
    blocks: list[list[Any]] = []
    for node in rank_nodes:
        if not node or "[" in node or "]" in node:
            raise RankMapError(f"{node!r:.80} is not a node name")
        if blocks and blocks[-1][0] == node:
            blocks[-1][1] += 1
        else:
            blocks.append([node, 1])
    runs: list[list[Any]] = []
    # Then consecutive blocks of one size whose nodes count up by one, as one range.
    i = 0
    while i < len(blocks):
        node, count = blocks[i]
        j = i + 1
        parts = _numbered(node)
        if parts is not None:
            prefix, number, suffix = parts
            while j < len(blocks) and blocks[j][1] == count and \
                    blocks[j][0] == f"{prefix}{int(number) + j - i:0{len(number)}d}{suffix}" \
                    and len(str(int(number) + j - i)) <= len(number):
                j += 1
            if j - i > 1:
                last = f"{int(number) + j - i - 1:0{len(number)}d}"
                runs.append([f"{prefix}[{number}-{last}]{suffix}", count])
                i = j
                continue
        runs.append([node, count])
        i += 1
    return runs


def decode(runs: Any) -> list[str]:
    """The node of every rank from compact ``runs``; RankMapError if they are malformed
    or expand past MAX_RANKS."""
    if not isinstance(runs, list):
        raise RankMapError(f"a rank map is a list of [nodes, ranks] pairs, got "
                           f"{type(runs).__name__}")
    key = _key(runs)
    if key is not None:
        with _last_lock:
            last = _last.get(key)
        if last is not None:
            return list(last)  # the caller's own list
    out = _decode(runs)
    if key is not None and len(out) <= MAX_KEPT_RANKS:
        with _last_lock:
            _last.clear()  # the newest map only: a generation's plans share it
            _last[key] = tuple(out)
    return out


def _key(runs: list[Any]) -> tuple[tuple[str, int], ...] | None:
    """``runs`` as a hashable key (None if they are not all [str, int] pairs: decode
    then refuses them with the reason)."""
    try:
        key = tuple((run[0], run[1]) for run in runs)
    except (TypeError, IndexError, KeyError):
        return None
    if not all(type(n) is str and type(c) is int and len(run) == 2
               for (n, c), run in zip(key, runs, strict=True)):
        return None
    return key


def _decode(runs: list[Any]) -> list[str]:
    out: list[str] = []
    for i, run in enumerate(runs):
        if not (isinstance(run, list) and len(run) == 2 and isinstance(run[0], str)
                and run[0] and isinstance(run[1], int) and not isinstance(run[1], bool)
                and run[1] > 0):
            raise RankMapError(f"rank map run {i}: expected [nodes, ranks > 0], got "
                               f"{run!r:.80}")
        nodes, count = run
        names = _expand(nodes, i)
        if len(out) + len(names) * count > MAX_RANKS:
            raise RankMapError(f"rank map expands past {MAX_RANKS} ranks")
        # Each name ``count`` times in a row: ``count`` strided slice assignments run
        # in C (32,768 ranks: 0.1 ms instead of 2 ms of a Python loop).
        block: list[str] = [""] * (len(names) * count)
        for k in range(count):
            block[k::count] = names
        out += block
    return out


def _numbered(node: str) -> tuple[str, str, str] | None:
    m = _NUMBERED.match(node)
    if m is None or "[" in node or "]" in node:
        return None
    return m.group(1), m.group(2), m.group(3)


def _expand(nodes: str, i: int) -> list[str]:
    if "[" not in nodes and "]" not in nodes:
        return [nodes]
    m = _RANGE.match(nodes)
    if m is None:
        raise RankMapError(f"rank map run {i}: {nodes!r:.80} is neither a node name nor "
                           "prefix[first-last]suffix")
    prefix, first, last, suffix = m.groups()
    if len(first) != len(last) or int(first) >= int(last):
        raise RankMapError(f"rank map run {i}: range [{first}-{last}] is not ascending "
                           "with bounds of one width")
    if int(last) - int(first) + 1 > MAX_RANKS:
        raise RankMapError(f"rank map expands past {MAX_RANKS} ranks")
    width = len(first)
    return [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(first), int(last) + 1)]
