"""Group ranks by stack signature, call the minority groups outliers, and name a group.

ByteRobust's rule (section 3 of the ByteRobust paper cited in README.md): group stacks by
string matching; the dominant groups are healthy (one fault at a time); the rest are
outliers; evict the parallel group the outliers share.

"Dominant" here: a group is healthy when its size is more than ``minority_ratio`` times
the largest group's (so two large groups, e.g. two pipeline stages waiting in send and
in recv, are both healthy). The signature levels of :mod:`signature` are tried from
the coarsest (the innermost user frame) to the finest (every thread); the first level
that splits the ranks into healthy groups plus a minority no larger than
``max_outlier_fraction`` of the world decides. Coarse first, because healthy ranks
waiting in the same collective can sit in different library frames (one inside the
gloo wait, one still in the Python wrapper), which a full-stack match would call
different; the finer levels are there for faults that only show below the user's code
(a rank stuck in a different native frame of the same call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.layout import ParallelLayout
from slurm_robust.stacks.dumps import RankDump
from slurm_robust.stacks.groups import Eviction, select_eviction
from slurm_robust.stacks.signature import (
    LEVELS,
    Key,
    SignatureOptions,
    Signer,
    format_frames,
)

UNKNOWN_NODE = "unknown"
MAX_GROUPS_SHOWN = 20

LEVEL_TEXT = {
    "user": "innermost user-code frame",
    "top": "innermost Python frames",
    "main": "whole main-thread stack",
    "full": "all threads",
}


@dataclass(frozen=True)
class AnalyzeOptions:
    """Knobs of the analysis (every field has a default that fits ByteRobust's rule).

    signature: normalisation (line numbers, top-N, what counts as library code).
    levels: signature levels to try, coarsest first.
    minority_ratio: a group no larger than this times the largest group is an outlier.
    max_outlier_fraction: a level whose outliers exceed this share of the world is not
        conclusive (there is no clear healthy majority).
    single_rank_dim: group evicted for a lone suspect rank (``pp``: ByteRobust's unit).
    """

    signature: SignatureOptions = field(default_factory=SignatureOptions)
    levels: tuple[str, ...] = LEVELS
    minority_ratio: float = 0.5
    max_outlier_fraction: float = 0.5
    single_rank_dim: str = "pp"

    def __post_init__(self) -> None:
        unknown = [lv for lv in self.levels if lv not in LEVELS]
        if unknown or not self.levels:
            raise UsageError(f"stacks: unknown or empty levels {unknown or self.levels}; "
                             f"choose from {LEVELS}")
        if not 0 < self.minority_ratio < 1:
            raise UsageError(f"stacks: minority_ratio must be in (0, 1), "
                             f"got {self.minority_ratio}")
        if not 0 < self.max_outlier_fraction <= 0.5:
            raise UsageError(f"stacks: max_outlier_fraction must be in (0, 0.5], "
                             f"got {self.max_outlier_fraction}")


@dataclass
class StackGroup:
    """Ranks that share one signature at the deciding level."""

    size: int
    ranks: list[int]
    healthy: bool
    example_rank: int
    example: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "ranks": compress_ranks(self.ranks),
                "healthy": self.healthy, "example_rank": self.example_rank,
                "example": self.example}


@dataclass
class LevelResult:
    level: str
    sizes: list[int]
    outliers: int
    conclusive: bool

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "groups": len(self.sizes), "sizes": self.sizes[:10],
                "outlier_ranks": self.outliers, "conclusive": self.conclusive}


@dataclass
class Analysis:
    """The outcome: ``verdict`` is ``evict``, ``uniform`` (all ranks alike at every
    level) or ``inconclusive`` (no clear healthy majority)."""

    verdict: str
    layout: ParallelLayout
    ranks_dumped: int
    missing_ranks: list[int]
    level: str | None
    groups: list[StackGroup]
    outlier_ranks: list[int]
    eviction: Eviction | None
    levels_tried: list[LevelResult]
    reason: str

    @property
    def nodes(self) -> list[str]:
        """Machines named for eviction (empty unless the verdict is ``evict``)."""
        return list(self.eviction.nodes) if self.eviction else []

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "reason": self.reason,
            "layout": {"tp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp},
            "world_size": self.layout.world_size, "ranks_dumped": self.ranks_dumped,
            "missing_ranks": compress_ranks(self.missing_ranks), "level": self.level,
            "outlier_ranks": self.outlier_ranks, "nodes": self.nodes,
            "eviction": self.eviction.to_json() if self.eviction else None,
            "groups": [g.to_json() for g in self.groups[:MAX_GROUPS_SHOWN]],
            "groups_not_shown": max(0, len(self.groups) - MAX_GROUPS_SHOWN),
            "levels_tried": [lv.to_json() for lv in self.levels_tried],
        }


def analyze(dumps: Sequence[RankDump], layout: ParallelLayout | None = None,
            options: AnalyzeOptions | None = None) -> Analysis:
    """Analyze one capture (one :class:`RankDump` per rank; missing ranks allowed).

    Without a layout, the job is taken as data-parallel only over the ranks seen, so
    the answer is the outliers' nodes. Raises UsageError when a dump's rank lies
    outside the layout or a rank appears twice.
    """
    options = options or AnalyzeOptions()
    by_rank: dict[int, RankDump] = {}
    for dump in dumps:
        if dump.rank in by_rank:
            raise UsageError(f"stacks: rank {dump.rank} appears twice in the capture")
        by_rank[dump.rank] = dump
    if layout is None:
        layout = ParallelLayout(dp=max(by_rank, default=0) + 1)
    outside = [r for r in by_rank if not 0 <= r < layout.world_size]
    if outside:
        raise UsageError(f"stacks: ranks {sorted(outside)[:5]} are outside layout "
                         f"{layout.describe()} (world size {layout.world_size}); "
                         f"pass the job's --layout")
    node_of = _node_lookup(by_rank, layout)
    signer = Signer(options.signature)
    world = layout.world_size
    missing = [r for r in range(world) if r not in by_rank]
    failed = _failed_ranks(by_rank, world)
    if len(failed) > options.max_outlier_fraction * world:
        kinds = sorted(set(failed.values()))
        reason = (f"no stack for {len(failed)} of {world} ranks ({', '.join(kinds)}): too "
                  "few to compare; see the capture's node-*.json and the errors per process")
        return Analysis("inconclusive", layout, len(by_rank), missing, None, [], [], None,
                        [], reason)
    tried: list[LevelResult] = []
    for level in options.levels:
        grouped = _group(signer, by_rank, world, level)
        sizes = [len(ranks) for ranks in grouped.values()]
        outliers = _outliers(grouped, options)
        conclusive = bool(outliers) and len(outliers) <= options.max_outlier_fraction * world
        tried.append(LevelResult(level, sizes, len(outliers), conclusive))
        if conclusive:
            eviction = select_eviction(outliers, layout, node_of, options.single_rank_dim)
            groups = _describe_groups(grouped, set(outliers), by_rank)
            reason = (f"at level '{level}' ({LEVEL_TEXT[level]}) {len(grouped)} groups; "
                      f"outlier ranks {compress_ranks(outliers)}: {eviction.reason}")
            return Analysis("evict", layout, len(by_rank), missing, level, groups,
                            outliers, eviction, tried, reason)
    uniform = all(len(lv.sizes) == 1 for lv in tried)
    if uniform:
        reason = ("every rank has the same stack at every level: nothing to single out "
                  "(all wait in the same place; look at the network or the shared store)")
    else:
        reason = ("no level shows a healthy majority with a small minority "
                  f"(at most {options.max_outlier_fraction:.0%} of ranks); not evicting")
    last = _group(signer, by_rank, world, options.levels[-1])
    return Analysis("uniform" if uniform else "inconclusive", layout, len(by_rank), missing,
                    None, _describe_groups(last, set(), by_rank), [], None, tried, reason)


def _group(signer: Signer, by_rank: dict[int, RankDump], world: int,
           level: str) -> dict[Key, list[int]]:
    grouped: dict[Key, list[int]] = {}
    for rank in range(world):
        grouped.setdefault(signer.rank_signature(by_rank.get(rank), level), []).append(rank)
    # Largest first; ties by lowest rank so the output is stable.
    return dict(sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[1][0])))


def _failed_ranks(by_rank: dict[int, RankDump], world: int) -> dict[int, str]:
    failed = {}
    for rank in range(world):
        dump = by_rank.get(rank)
        worker = dump.worker if dump else None
        if worker is None or worker.error:
            failed[rank] = worker.error if worker and worker.error else "missing"
    return failed


def _outliers(grouped: dict[Key, list[int]], options: AnalyzeOptions) -> list[int]:
    if len(grouped) < 2:
        return []
    largest = max(len(ranks) for ranks in grouped.values())
    limit = options.minority_ratio * largest
    return sorted(r for ranks in grouped.values() if len(ranks) <= limit for r in ranks)


def _describe_groups(grouped: dict[Key, list[int]], outliers: set[int],
                     by_rank: dict[int, RankDump]) -> list[StackGroup]:
    groups = []
    for index, ranks in enumerate(grouped.values()):
        if index >= MAX_GROUPS_SHOWN:
            # Only the first groups are shown; building examples for 10k groups is waste.
            groups.append(StackGroup(len(ranks), ranks, ranks[0] not in outliers, ranks[0], []))
            continue
        example = _example(by_rank.get(ranks[0]))
        groups.append(StackGroup(len(ranks), ranks, ranks[0] not in outliers, ranks[0],
                                 example))
    return groups


def _example(dump: RankDump | None) -> list[dict[str, Any]]:
    if dump is None:
        return [{"role": "missing", "frames": []}]
    out = []
    for proc in dump.processes:
        if proc.role != "worker" and proc.error in ("gone", "not_python"):
            continue
        entry: dict[str, Any] = {"role": proc.role, "pid": proc.pid, "node": dump.node}
        if proc.error:
            entry["error"] = f"{proc.error}: {proc.message}"[:300]
        entry["frames"] = format_frames(proc.main_thread(), limit=6)
        out.append(entry)
    return out


def _node_lookup(by_rank: dict[int, RankDump],
                 layout: ParallelLayout) -> Callable[[int], str]:
    def node_of(rank: int) -> str:
        dump = by_rank.get(rank)
        if dump is not None:
            return dump.node
        try:
            return layout.node_of(rank)
        except UsageError:
            return UNKNOWN_NODE
    return node_of


def compress_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 4, 6, 7]`` -> ``"0-2,4,6-7"``."""
    parts: list[str] = []
    values = sorted(set(ranks))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(parts)


def explain(analysis: Analysis) -> str:
    """A few lines for people: the levels tried, the groups, the decision."""
    lay = analysis.layout
    lines = [f"stacks: {lay.world_size} ranks ({analysis.ranks_dumped} dumped, "
             f"{len(analysis.missing_ranks)} missing), layout {lay.describe()}"]
    for lv in analysis.levels_tried:
        mark = "decides" if lv.conclusive else "no clear minority"
        lines.append(f"  level {lv.level:<4} ({LEVEL_TEXT[lv.level]}): {len(lv.sizes)} "
                     f"group(s), sizes {lv.sizes[:8]}{' ...' if len(lv.sizes) > 8 else ''}"
                     f" -> {mark}")
    for n, group in enumerate(analysis.groups[:MAX_GROUPS_SHOWN], 1):
        tag = "healthy" if group.healthy else "OUTLIER"
        lines.append(f"  group {n}: {group.size} rank(s) {compress_ranks(group.ranks)} "
                     f"[{tag}], e.g. rank {group.example_rank}:")
        for proc in group.example:
            head = f"      {proc['role']} pid {proc.get('pid', '?')}"
            if proc.get("error"):
                lines.append(f"{head}: {proc['error']}")
                continue
            lines.append(f"{head}: " + " <- ".join(proc["frames"][:4]))
    if len(analysis.groups) > MAX_GROUPS_SHOWN:
        lines.append(f"  ... {len(analysis.groups) - MAX_GROUPS_SHOWN} more group(s)")
    lines.append(f"verdict: {analysis.verdict}: {analysis.reason}")
    if analysis.eviction:
        ev = analysis.eviction
        lines.append(f"evict {ev.dim.upper()} group(s) {[list(g) for g in ev.groups]} "
                     f"on machines {', '.join(ev.nodes)}")
    return "\n".join(lines)
