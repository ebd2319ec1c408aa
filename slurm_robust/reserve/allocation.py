"""The nodes a job *was given*, not the nodes it holds now.

A job run with ``--no-kill`` loses a node that Slurm marks DOWN: Slurm removes it from
the allocation (sacct shows the job RESIZING), so ``SLURM_JOB_NODELIST`` at job end no
longer names it. A verdict for that node is still the job's business: it is
judged against every node any record of the job ran on, as Slurm's accounting tells
(``sacct --duplicates``: every allocation of every restart, and every step), never the
job's own word. The current node list answers first; sacct is asked once, on a miss.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

from slurm_robust.errors import SlurmRobustError
from slurm_robust.slurm import Slurm, check_job_id, expand_hostlist


def sacct_nodes(slurm: Slurm, job_id: str) -> set[str]:
    """Every node any record of the job (all restarts, all steps) ran on."""
    raw = slurm.sacct_raw(["NodeList"], ["-j", check_job_id(job_id), "--duplicates"])
    out: set[str] = set()
    for line in raw.splitlines():
        expr = line.strip()
        if expr and not expr.lower().startswith("none"):
            out.update(expand_hostlist(expr))
    return out


class GivenNodes(Collection[str]):
    """``current`` plus, asked lazily once, the nodes sacct says the job was given.

    A sacct failure (no accounting) leaves the current list only: refusing a verdict is
    the safe side."""

    def __init__(self, current: Sequence[str], ask: Callable[[], set[str]]) -> None:
        self.current = frozenset(current)
        self._ask = ask
        self._given: frozenset[str] | None = None
        self.error: str | None = None

    def given(self) -> frozenset[str]:
        if self._given is None:
            try:
                self._given = self.current | frozenset(self._ask())
            except SlurmRobustError as exc:
                self.error = str(exc)
                self._given = self.current
        return self._given

    def lost(self) -> frozenset[str]:
        """Nodes the job was given that it no longer holds."""
        return self.given() - self.current

    def __contains__(self, node: object) -> bool:
        return node in self.current or node in self.given()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.given()))

    def __len__(self) -> int:
        return len(self.given())
