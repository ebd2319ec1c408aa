"""Which parallel group to evict, given the ranks that look faulty.

ByteRobust evicts the whole parallel group the suspect ranks share (over-eviction
beats slow diagnosis). The rule, shared by the hang analyzer and the fail-slow vote:

1. One suspect rank: evict its group of ``single_rank_dim`` (default ``pp``, the
   pipeline, ByteRobust's unit: a stage that stops stalls its pipeline neighbours, and
   their machines are the next suspects). With ``pp=1`` that group is the rank itself,
   so the answer is the rank's node.
2. Several suspects: the dimension in which one group holds them all (two distinct
   ranks share at most one group, so there is at most one such dimension).
3. Otherwise the dimension whose groups, taken together, cover the suspects with the
   fewest machines (then the fewest ranks; ties in the order pp, tp, dp).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from slurm_robust.errors import UsageError
from slurm_robust.layout import DIMENSIONS, ParallelLayout

# Tie order for rule 3: the pipeline first (ByteRobust's unit), the data-parallel
# group last because it usually spans the most machines.
_TIE_ORDER: tuple[str, ...] = ("pp", "tp", "dp")


@dataclass(frozen=True)
class Eviction:
    """The group named for eviction and why.

    ``dim`` is ``tp``, ``pp`` or ``dp``; ``groups`` the group(s) of that dimension
    holding the suspects (one when they share a group); ``ranks`` their union;
    ``nodes`` the machines to evict; ``shared`` whether one group holds every suspect.
    """

    dim: str
    groups: tuple[tuple[int, ...], ...]
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    shared: bool
    reason: str

    @property
    def key(self) -> str:
        """A stable name for the evicted group(s), e.g. ``pp:[1,3,5,7]``."""
        return ";".join(f"{self.dim}:[{','.join(map(str, g))}]" for g in self.groups)

    def to_json(self) -> dict[str, object]:
        return {"dim": self.dim, "groups": [list(g) for g in self.groups],
                "ranks": list(self.ranks), "nodes": list(self.nodes), "shared": self.shared,
                "key": self.key, "reason": self.reason}


def select_eviction(suspects: Iterable[int], layout: ParallelLayout,
                    node_of: Callable[[int], str] | None = None,
                    single_rank_dim: str = "pp") -> Eviction:
    """Name the parallel group to evict for some suspect ranks (see the module doc).

    ``node_of`` maps a rank to its machine (default: ``layout.node_of``).
    Raises UsageError when there are no suspects or a rank is outside the layout.
    """
    ranks = sorted(set(suspects))
    if not ranks:
        raise UsageError("eviction: no suspect ranks given")
    if single_rank_dim not in DIMENSIONS:
        raise UsageError(f"eviction: single_rank_dim must be one of {DIMENSIONS}, "
                         f"got {single_rank_dim!r}")
    for rank in ranks:
        layout.check_rank(rank)
    nodes_of = _nodes_fn(layout, node_of)
    if len(ranks) == 1:
        group = layout.group(ranks[0], single_rank_dim)
        return Eviction(dim=single_rank_dim, groups=(group,), ranks=group,
                        nodes=nodes_of(group), shared=True,
                        reason=f"one suspect rank ({ranks[0]}); evicting its "
                               f"{single_rank_dim.upper()} group {list(group)}")
    options = []
    for dim in DIMENSIONS:
        groups = tuple(sorted({layout.group(r, dim) for r in ranks}))
        union = tuple(sorted({r for g in groups for r in g}))
        options.append((dim, groups, union, nodes_of(union)))
    shared = [o for o in options if len(o[1]) == 1]
    if shared:
        dim, groups, union, nodes = shared[0]
        reason = (f"suspect ranks {ranks} all belong to {dim.upper()} group "
                  f"{list(groups[0])}")
        return Eviction(dim, groups, union, nodes, True, reason)
    dim, groups, union, nodes = min(
        options, key=lambda o: (len(o[3]), len(o[2]), _TIE_ORDER.index(o[0])))
    spans = ", ".join(f"{o[0].upper()}: {len(o[1])} groups on {len(o[3])} machines"
                      for o in options)
    reason = (f"suspect ranks {ranks} share no single group; the {dim.upper()} groups "
              f"cover them with the fewest machines ({spans})")
    return Eviction(dim, groups, union, nodes, False, reason)


def _nodes_fn(layout: ParallelLayout,
              node_of: Callable[[int], str] | None) -> Callable[[Iterable[int]], tuple[str, ...]]:
    lookup = node_of or layout.node_of

    def nodes(ranks: Iterable[int]) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for rank in sorted(ranks):
            seen.setdefault(lookup(rank), None)
        return tuple(seen)

    return nodes
