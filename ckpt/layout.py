"""The choice of each rank's backup peer for a parallel layout (TP x PP x DP).

The layout itself is :class:`slurm_robust.layout.ParallelLayout`, shared with the stack
analysis; it is re-exported here and from :mod:`slurm_robust.ckpt`.

ByteRobust places each rank's backup on a rank that shares none of its TP, PP or DP
groups, on another node, so that evicting any one parallel group (over-eviction) never
loses both copies of a shard. With pure data parallelism every rank shares the one DP
group, so the rule reduces to "the next node".
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from slurm_robust.ckpt.errors import PeerBackupError
from slurm_robust.errors import UsageError
from slurm_robust.layout import ParallelLayout

__all__ = ["ParallelLayout", "backup_sources", "pick_peers"]

#: Above this many ranks the exhaustive matching fallback is skipped (it is quadratic).
_MATCHING_MAX_WORLD = 512

def pick_peers(layout: ParallelLayout, rank_nodes: Sequence[str]) -> list[int]:
    """Return ``peers`` where ``peers[r]`` is the rank that holds rank r's backup.

    The mapping is a permutation (every rank holds exactly one backup, which bounds host
    memory), every peer sits on another node, and it shares as few parallel groups with
    its rank as the layout allows: none when two or more dimensions exceed 1. Candidates
    are coordinate shifts, tried from the smallest, so with pure data parallelism and
    ranks laid out node by node the peer is the same local rank on the next node; then
    rank rotations; then (up to 512 ranks) a bipartite matching, for node boundaries
    that cut across the coordinates.

    Raises:
        PeerBackupError: all ranks are on one node, so no backup can leave the node.
        UsageError: the layout does not match the number of ranks.
    """
    world = len(rank_nodes)
    if layout.world_size != world:
        raise UsageError(f"layout {layout.as_dict()} has {layout.world_size} ranks, "
                         f"but {world} rank nodes were given")
    if len(set(rank_nodes)) < 2:
        raise PeerBackupError(f"all {world} ranks are on node {rank_nodes[0]!r}: a peer "
                              "backup needs two nodes; disable peer_backup for this run")
    best: tuple[int, list[int]] | None = None
    for peers in _candidates(layout, world):
        if any(rank_nodes[p] == rank_nodes[r] for r, p in enumerate(peers)):
            continue
        score = max(len(layout.shared_groups(r, p)) for r, p in enumerate(peers))
        if best is None or score < best[0]:
            best = (score, peers)
        if score == 0:
            break
    if (best is None or best[0] > 0) and world <= _MATCHING_MAX_WORLD:
        matched = _match_disjoint(layout, rank_nodes)
        if matched is not None:
            best = (0, matched)
    if best is None:
        raise PeerBackupError(
            f"no rotation of layout {layout.as_dict()} puts every backup on another node "
            f"(ranks per node: {_ranks_per_node(rank_nodes)}); place ranks node by node")
    return best[1]


def _candidates(layout: ParallelLayout, world: int) -> Iterator[list[int]]:
    """Permutations to try: shifts of the (tp, dp, pp) coordinates, smallest first, then
    plain rank rotations (which help when node boundaries cut across the coordinates)."""
    coords = [layout.coords(r)._asdict() for r in range(world)]
    dims = layout.dims()
    names = [name for name, _size in dims]
    # Slowest dimension outermost, so that small shifts of the fastest come first.
    for shift_rev in itertools.product(*(range(size) for _n, size in reversed(dims))):
        shift = dict(zip(reversed(names), shift_rev, strict=True))
        if any(shift.values()):
            yield [layout.rank_of({d: c[d] + shift[d] for d in names}) for c in coords]
    for offset in range(1, world):
        yield [(r + offset) % world for r in range(world)]


def _match_disjoint(layout: ParallelLayout, rank_nodes: Sequence[str]) -> list[int] | None:
    """A permutation with every peer off-node and sharing no group, by bipartite matching
    (Kuhn's augmenting paths), for node boundaries that no shift respects."""
    world = len(rank_nodes)
    ok = [[h for h in range(world) if rank_nodes[h] != rank_nodes[r]
           and not layout.shared_groups(r, h)] for r in range(world)]
    holder_of: dict[int, int] = {}  # holder -> rank whose backup it takes

    def augment(rank: int, seen: set[int]) -> bool:
        for h in ok[rank]:
            if h not in seen:
                seen.add(h)
                if h not in holder_of or augment(holder_of[h], seen):
                    holder_of[h] = rank
                    return True
        return False

    for rank in range(world):
        if not augment(rank, set()):
            return None
    peers = [-1] * world
    for holder, rank in holder_of.items():
        peers[rank] = holder
    return peers


def backup_sources(peers: Sequence[int]) -> list[int]:
    """Invert :func:`pick_peers`: ``sources[h]`` is the rank whose backup h holds."""
    sources = [-1] * len(peers)
    for rank, holder in enumerate(peers):
        if sources[holder] != -1:
            raise UsageError(f"peers is not a permutation: rank {holder} holds two backups")
        sources[holder] = rank
    return sources


def _ranks_per_node(rank_nodes: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in rank_nodes:
        counts[node] = counts.get(node, 0) + 1
    return counts
