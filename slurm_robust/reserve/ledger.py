"""The per-job blame ledger: which nodes a job's verdicts drained, which spares it got.

Written only by EpilogSlurmctld (root/SlurmUser), under the reserve lock, in a
root-owned directory (``ReserveConfig.ledger_dir``, mode 0700), so a job cannot reset
its own count (its verdict files live in a directory it owns; this does not). It is what
makes ``reserve.job_blame_cap`` a cap over the job's whole life, across requeues, and
what keeps a job from being handed more spares than it lost.
One small JSON file per job (``<job_id>.json``, ``v`` = 1); a file that cannot be read
counts as the cap reached (fail closed: nothing more is drained or handed over).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from slurm_robust.records import write_json_atomic
from slurm_robust.slurm import check_job_id

LEDGER_VERSION = 1


@dataclass
class JobLedger:
    """Nodes drained for one job's verdicts and spares handed to it, over its life."""

    job_id: str
    drained: list[str] = field(default_factory=list)
    handed_over: list[str] = field(default_factory=list)
    #: Handed-over spares that then failed a check (their prolog), and what replaced them
    #: (bounded by ``reserve.spare_retries``; not counted against the blame cap).
    spare_failed: list[str] = field(default_factory=list)
    replacements: list[str] = field(default_factory=list)
    #: Set when the file was unreadable: treat the cap as reached.
    broken: bool = False

    def drain_room(self, cap: int) -> int:
        """How many more nodes this job's verdicts may drain."""
        return 0 if self.broken else max(cap - len(set(self.drained)), 0)

    def spare_room(self, cap: int) -> int:
        """How many more spares it may get: never more than it lost, never over the cap."""
        if self.broken:
            return 0
        return max(min(cap, len(set(self.drained))) - len(self.handed_over), 0)


def ledger_path(ledger_dir: Path, job_id: str) -> Path:
    return ledger_dir / f"{check_job_id(job_id)}.json"


def load_ledger(ledger_dir: Path, job_id: str) -> JobLedger:
    path = ledger_path(ledger_dir, job_id)
    try:
        raw = json.loads(path.read_text())
        return JobLedger(job_id, [str(n) for n in raw["drained"]],
                         [str(n) for n in raw["handed_over"]],
                         [str(n) for n in raw.get("spare_failed", [])],
                         [str(n) for n in raw.get("replacements", [])])
    except FileNotFoundError:
        return JobLedger(job_id)
    except (OSError, ValueError, KeyError, TypeError):
        return JobLedger(job_id, broken=True)


def save_ledger(ledger_dir: Path, ledger: JobLedger) -> None:
    ledger_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ledger_dir, 0o700)
    write_json_atomic(ledger_path(ledger_dir, ledger.job_id),
                      {"v": LEDGER_VERSION, "job_id": ledger.job_id,
                       "drained": sorted(set(ledger.drained)),
                       "handed_over": ledger.handed_over,
                       "spare_failed": ledger.spare_failed,
                       "replacements": ledger.replacements}, mode=0o600)
