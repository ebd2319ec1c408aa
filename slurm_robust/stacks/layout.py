"""Parallel layout of a training job: which TP, PP and DP group each rank belongs to.

Ranks are laid out in Megatron-LM's default order ``tp-cp-ep-dp-pp`` (with cp = ep = 1):
tensor-parallel rank varies fastest, then data-parallel, then pipeline stage::

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

So with ``tp=2, pp=2, dp=2`` ranks 0,1 form a TP group, ranks 0,2 a DP group and
ranks 0,4 a PP group (a pipeline). torch's ``DeviceMesh(("pp", "dp", "tp"))`` with a
row-major mesh gives the same numbering.

A rank belongs to exactly one group per dimension; two distinct ranks share at most
one group. Nodes: ranks are packed onto nodes in rank order (``ranks_per_node`` and an
optional list of node names), or given by an explicit ``{rank: node}`` mapping, which
is what a capture records.

Other features import this module (the checkpoint peer selection uses
:meth:`ParallelLayout.shares_any_group`); it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from slurm_robust.errors import UsageError

DIMENSIONS: tuple[str, ...] = ("tp", "pp", "dp")


class Coords(NamedTuple):
    """A rank's position in each parallel dimension."""

    tp: int
    pp: int
    dp: int


@dataclass(frozen=True)
class ParallelLayout:
    """TP x PP x DP layout in Megatron order, plus where each rank runs.

    Parameters
    ----------
    tp, pp, dp:
        Group sizes; the world size is their product.
    ranks_per_node:
        Ranks packed per node in rank order (rank // ranks_per_node is the node index).
        Ignored when ``node_map`` is given.
    node_names:
        Names for node indices 0, 1, ...; default ``node0``, ``node1``, ...
    node_map:
        Explicit ``{rank: node}``; takes precedence over ``ranks_per_node``.

    Raises
    ------
    UsageError
        On a non-positive size, or a node map that does not cover the world.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ranks_per_node: int | None = None
    node_names: tuple[str, ...] = ()
    node_map: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for dim in DIMENSIONS:
            value = getattr(self, dim)
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"layout: {dim} must be a positive integer, got {value!r}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise UsageError(f"layout: ranks_per_node must be >= 1, got {self.ranks_per_node}")
        if self.node_map:
            missing = [r for r in range(self.world_size) if r not in self.node_map]
            if missing:
                raise UsageError(f"layout: node map lacks {len(missing)} rank(s), first "
                                 f"{missing[:5]}; world size is {self.world_size}")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def size(self, dim: str) -> int:
        """Size of the groups of ``dim`` (``tp``, ``pp`` or ``dp``)."""
        _check_dim(dim)
        return int(getattr(self, dim))

    def check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise UsageError(f"layout: rank {rank} is outside the world of {self.world_size} "
                             f"(tp={self.tp}, pp={self.pp}, dp={self.dp})")

    def coords(self, rank: int) -> Coords:
        """The (tp, pp, dp) ranks of a global rank."""
        self.check_rank(rank)
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return Coords(tp=tp_rank, pp=pp_rank, dp=dp_rank)

    def rank_of(self, coords: Coords) -> int:
        """Inverse of :meth:`coords`."""
        return coords.tp + self.tp * (coords.dp + self.dp * coords.pp)

    def group(self, rank: int, dim: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s group in ``dim``, in ascending order (it included)."""
        _check_dim(dim)
        c = self.coords(rank)
        return tuple(self.rank_of(c._replace(**{dim: i})) for i in range(self.size(dim)))

    def group_index(self, rank: int, dim: str) -> int:
        """A stable index of ``rank``'s group among the groups of ``dim``.

        It is the group's position in :meth:`groups` (ordered by lowest member).
        """
        lowest = self.group(rank, dim)[0]
        return self._group_starts(dim).index(lowest)

    def groups(self, dim: str) -> list[tuple[int, ...]]:
        """Every group of ``dim``, ordered by its lowest rank."""
        return [self.group(start, dim) for start in self._group_starts(dim)]

    def _group_starts(self, dim: str) -> list[int]:
        _check_dim(dim)
        return [r for r in range(self.world_size) if getattr(self.coords(r), dim) == 0]

    def shares_any_group(self, a: int, b: int) -> bool:
        """True when ranks ``a`` and ``b`` are in a common TP, PP or DP group."""
        ca, cb = self.coords(a), self.coords(b)
        differing = sum(1 for dim in DIMENSIONS if getattr(ca, dim) != getattr(cb, dim))
        return differing <= 1

    def node_of(self, rank: int) -> str:
        """The node a rank runs on."""
        self.check_rank(rank)
        if self.node_map:
            return self.node_map[rank]
        if self.ranks_per_node is None:
            raise UsageError("layout: no node mapping; give ranks_per_node or a node map")
        index = rank // self.ranks_per_node
        if self.node_names:
            if index >= len(self.node_names):
                raise UsageError(f"layout: rank {rank} is on node index {index} but only "
                                 f"{len(self.node_names)} node names were given")
            return self.node_names[index]
        return f"node{index}"

    def nodes_of(self, ranks: Iterable[int]) -> list[str]:
        """The distinct nodes of some ranks, in order of first appearance by rank."""
        seen: dict[str, None] = {}
        for rank in sorted(set(ranks)):
            seen.setdefault(self.node_of(rank), None)
        return list(seen)

    def with_nodes(self, node_map: Mapping[int, str]) -> ParallelLayout:
        """The same layout with an explicit ``{rank: node}`` mapping."""
        return ParallelLayout(self.tp, self.pp, self.dp, node_map=dict(node_map))

    def describe(self) -> str:
        return f"tp={self.tp},pp={self.pp},dp={self.dp}"


def parse_layout(text: str, ranks_per_node: int | None = None,
                 node_names: Sequence[str] = ()) -> ParallelLayout:
    """Parse ``"tp=2,pp=4,dp=4"`` (any order; missing sizes are 1).

    Raises UsageError naming the bad part and the accepted keys.
    """
    sizes: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in DIMENSIONS:
            raise UsageError(f"layout: cannot parse {part!r} in {text!r}; "
                             f"expected e.g. tp=2,pp=4,dp=4 (keys: {', '.join(DIMENSIONS)})")
        try:
            sizes[key] = int(value)
        except ValueError:
            raise UsageError(f"layout: {key}={value!r} is not an integer") from None
    return ParallelLayout(ranks_per_node=ranks_per_node, node_names=tuple(node_names),
                          **sizes)


def _check_dim(dim: str) -> None:
    if dim not in DIMENSIONS:
        raise UsageError(f"layout: unknown dimension {dim!r}; expected one of {DIMENSIONS}")
