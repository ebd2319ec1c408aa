"""Fetch Slurm's records through ``slurm_robust.slurm`` and parse them.

A thin layer: it builds the arguments, calls the access layer's raw-output methods, and
hands the text to the pure parsers in :mod:`slurm_text`. Times are requested as Unix
seconds (``SLURM_TIME_FORMAT=%s``), so no time zone is guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from slurm_robust.analysis.frames import LoadIssues
from slurm_robust.analysis.slurm_text import (
    EVENT_FIELDS,
    SACCT_FIELDS,
    merge_node_events,
    parse_node_events,
    parse_sacct,
    parse_sinfo_reasons,
)
from slurm_robust.slurm import Slurm

TIME_ENV = {"SLURM_TIME_FORMAT": "%s"}
# sacct and sacctmgr default to "since midnight"; an explicit early start means "all".
EPOCH_START = "1970-01-02T00:00:00"


def _slurm_time(t: float | None, default: str) -> str:
    return default if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass
class SlurmRecords:
    """Job-level sacct records (with requeue duplicates), steps and node events."""

    jobs: pd.DataFrame
    steps: pd.DataFrame
    node_events: pd.DataFrame


def fetch_slurm_records(since: float | None = None, until: float | None = None,
                        job_ids: Iterable[str] | None = None,
                        issues: LoadIssues | None = None, client: Any = None,
                        ) -> SlurmRecords:
    """Run sacct (all users, duplicates), ``sacctmgr show event`` and ``sinfo -R``.

    ``client`` is a ``slurm_robust.slurm.Slurm`` (default: one with Unix-seconds times).
    Raises ``SlurmCommandError`` when a command fails.
    """
    if client is None:

        client = Slurm(env=TIME_ENV)
    issues = issues if issues is not None else LoadIssues()
    args = ["--duplicates", "--allusers", "-S", _slurm_time(since, EPOCH_START),
            "-E", _slurm_time(until, "now")]
    ids = sorted(set(job_ids or ()))
    if ids:
        args += ["-j", ",".join(ids)]
    jobs, steps = parse_sacct(client.sacct_raw(SACCT_FIELDS, args), SACCT_FIELDS)
    issues.add(issues.malformed_lines, "sacct", jobs.malformed, f"sacct: {jobs.example}")
    ev_args = [f"Start={_slurm_time(since, EPOCH_START)}", f"End={_slurm_time(until, 'now')}",
               "Event=Node"]
    events = parse_node_events(client.node_events_raw(EVENT_FIELDS, ev_args), EVENT_FIELDS)
    issues.add(issues.malformed_lines, "sacctmgr show event", events.malformed,
               f"sacctmgr: {events.example}")
    reasons = parse_sinfo_reasons(client.drain_reasons_raw())
    issues.add(issues.malformed_lines, "sinfo -R", reasons.malformed,
               f"sinfo -R: {reasons.example}")
    return SlurmRecords(jobs.frame, steps.frame, merge_node_events(events.frame, reasons.frame))
