"""Can a partition ever run an allocation of this size? Refuse at submit, not after a hang.

Slurm accepts ``sbatch -N 5`` on a 4-node partition and leaves it pending forever with
reason ``PartitionNodeLimit``/``PartitionConfig``; a robust run asks for workers + spares,
so an extra spare is the easy way to get there. :func:`check_fits` compares the request
with the partition's node count and ``MaxNodes`` and raises a one-line
:class:`UsageError` that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_robust.errors import UsageError
from slurm_robust.slurm.records import parse_scontrol_oneliner


@dataclass(frozen=True)
class PartitionLimits:
    """How many nodes one job of ``name`` can ever get."""

    name: str
    total_nodes: int
    max_nodes: int | None  # None: UNLIMITED

    @property
    def most(self) -> int:
        return self.total_nodes if self.max_nodes is None else min(self.total_nodes,
                                                                    self.max_nodes)


def parse_limits(line: str) -> PartitionLimits:
    """Limits from one ``scontrol show partition -o`` line."""
    fields = parse_scontrol_oneliner(line)
    name = fields.get("PartitionName", "?")
    try:
        total = int(fields["TotalNodes"])
    except (KeyError, ValueError) as exc:
        raise UsageError(f"partition {name!r}: no node count in scontrol's answer") from exc
    raw = fields.get("MaxNodes", "UNLIMITED")
    return PartitionLimits(name=name, total_nodes=total,
                           max_nodes=None if raw in ("UNLIMITED", "") else int(raw))


def pick_partition(text: str, name: str | None) -> PartitionLimits:
    """The named partition (or the default one, ``Default=YES``) from every line of
    ``scontrol show partition -o``."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for line in lines:
        fields = parse_scontrol_oneliner(line)
        if (name is None and fields.get("Default") == "YES") or \
                (name is not None and fields.get("PartitionName") == name):
            return parse_limits(line)
    if name is None:
        raise UsageError("no default partition in this cluster: give --partition")
    known = ", ".join(parse_scontrol_oneliner(ln).get("PartitionName", "?") for ln in lines)
    raise UsageError(f"partition {name!r} does not exist (known: {known or 'none'})")


def check_fits(limits: PartitionLimits, nodes: int, spares: int) -> None:
    """Raise when ``nodes + spares`` can never be allocated in the partition."""
    want = nodes + spares
    if want <= limits.most:
        return
    why = (f"has {limits.total_nodes} nodes" if limits.most == limits.total_nodes
           else f"allows at most {limits.max_nodes} nodes per job (MaxNodes)")
    fit = max(limits.most - spares, 0)
    raise UsageError(f"{nodes} nodes + {spares} spares = {want} nodes, but partition "
                     f"{limits.name!r} {why}: it would pend forever; use at most "
                     f"{fit} nodes with {spares} spares, fewer spares, or a bigger partition")
