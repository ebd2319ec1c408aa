"""Parallel layout of a training job: which TP, PP and DP group each rank belongs to.

One layout for every feature: the stack analysis and fail-slow detection (groups, nodes,
eviction) and the checkpoint peer choice (:mod:`slurm_robust.ckpt.layout`). A leaf: it
imports only :mod:`slurm_robust.errors`.

By default ranks are laid out in Megatron-LM's order ``tp-cp-ep-dp-pp`` (with cp = ep = 1):
tensor-parallel rank varies fastest, then data-parallel, then pipeline stage::

    rank = tp_rank + tp * (dp_rank + dp * pp_rank)

``order`` names another order, fastest-varying dimension first (e.g. ``dp-tp-pp``).

So with ``tp=2, pp=2, dp=2`` ranks 0,1 form a TP group, ranks 0,2 a DP group and
ranks 0,4 a PP group (a pipeline). torch's ``DeviceMesh(("pp", "dp", "tp"))`` with a
row-major mesh gives the same numbering.

A rank belongs to exactly one group per dimension; two distinct ranks share at most
one group. Nodes: ranks are packed onto nodes in rank order (``ranks_per_node`` and an
optional list of node names), or given by an explicit ``{rank: node}`` mapping, which
is what a capture records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from slurm_robust.errors import UsageError

DIMENSIONS: tuple[str, ...] = ("tp", "pp", "dp")

#: Megatron-LM's default rank order: TP varies fastest, then DP, then PP.
DEFAULT_ORDER = "tp-dp-pp"


class Coords(NamedTuple):
    """A rank's position in each parallel dimension."""

    tp: int
    pp: int
    dp: int


@dataclass(frozen=True)
class ParallelLayout:
    """TP x PP x DP layout and rank order, plus where each rank runs.

    Parameters
    ----------
    tp, pp, dp:
        Group sizes; the world size is their product.
    order:
        The dimensions from fastest- to slowest-varying in the rank number.
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
        On a non-positive size, an order that does not name tp, dp and pp once, or a node
        map that does not cover the world.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    order: str = DEFAULT_ORDER
    ranks_per_node: int | None = None
    node_names: tuple[str, ...] = ()
    # A dict cannot be hashed; equal layouts still compare their node maps.
    node_map: Mapping[int, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for dim in DIMENSIONS:
            value = getattr(self, dim)
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"layout: {dim} must be a positive integer, got {value!r}")
        if sorted(self.order.split("-")) != sorted(DIMENSIONS):
            raise UsageError(f"layout: order {self.order!r} must name tp, dp, pp once, "
                             f"fastest first, e.g. {DEFAULT_ORDER!r}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise UsageError(f"layout: ranks_per_node must be >= 1, got {self.ranks_per_node}")
        if self.node_map:
            missing = [r for r in range(self.world_size) if r not in self.node_map]
            if missing:
                raise UsageError(f"layout: node map lacks {len(missing)} rank(s), first "
                                 f"{missing[:5]}; world size is {self.world_size}")

    @classmethod
    def data_parallel(cls, world_size: int) -> ParallelLayout:
        """Pure data parallelism over ``world_size`` ranks."""
        return cls(tp=1, pp=1, dp=world_size)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def as_dict(self) -> dict[str, int | str]:
        """Sizes and order, as checkpoint manifests record them."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "order": self.order}

    def dims(self) -> list[tuple[str, int]]:
        """(dimension, size) from the fastest- to the slowest-varying."""
        return [(d, getattr(self, d)) for d in self.order.split("-")]

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
        out: dict[str, int] = {}
        for name, size in self.dims():
            out[name] = rank % size
            rank //= size
        return Coords(**out)

    def rank_of(self, coords: Coords | Mapping[str, int]) -> int:
        """Inverse of :meth:`coords`; coordinates wrap around modulo each size (so a shifted
        coordinate names a rank, as the checkpoint peer choice needs)."""
        values = coords._asdict() if isinstance(coords, Coords) else coords
        rank, stride = 0, 1
        for name, size in self.dims():
            rank += (values[name] % size) * stride
            stride *= size
        return rank

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

    def shared_groups(self, a: int, b: int) -> list[str]:
        """The groups of more than one rank that ranks a and b both belong to (a TP group:
        same pp and dp), in the order tp, pp, dp."""
        ca, cb = self.coords(a), self.coords(b)
        return [dim for dim in ("tp", "pp", "dp") if self.size(dim) > 1
                and all(getattr(ca, o) == getattr(cb, o) for o in DIMENSIONS if o != dim)]

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
        return ParallelLayout(self.tp, self.pp, self.dp, self.order, node_map=dict(node_map))

    def describe(self) -> str:
        text = f"tp={self.tp},pp={self.pp},dp={self.dp}"
        return text if self.order == DEFAULT_ORDER else f"{text},order={self.order}"


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
