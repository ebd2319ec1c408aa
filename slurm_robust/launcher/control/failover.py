"""Controller failover: terms, claims, the lease, and where the controller runs.

The controller is not tied to one process for the whole run. Each controller acts under a
**term** (an int in ``state.json``, ``controller.json`` and every plan). The rules that keep
exactly one controller acting:

- **Claim.** A controller acts under term ``t`` only after creating
  ``<run_dir>/term-<step key>.<t>`` with ``O_CREAT | O_EXCL`` (one winner per term, also on
  NFS v3+). The successor claims ``t + 1`` before it starts.
- **Fence.** A controller checks that no claim for ``t + 1`` exists before every tick,
  before answering an agent and before writing ``state.json`` (:func:`superseded`). An old
  controller that comes back (SIGSTOP, a long pause) therefore stands down at its first
  step; it never writes a plan or the state again.
- **Lease.** A controller touches ``<run_dir>/controller.lease`` every :data:`LEASE_RENEW_S`
  from a thread of its own, while its tick loop is late at worst, not frozen
  (controller.FROZEN_S); a successor claims only once the lease is older than the
  heartbeat timeout, so a controller that still runs but is unreachable or slow for a
  while is not replaced behind its back (nor its node blamed).
- **Agents.** An agent remembers the newest term it has seen (``controller.json``, plans)
  and ignores a plan of an older term; it sends its term in every report, and a
  controller that reads a newer term in a report stands down too.

Where the first controller runs: on agent 1 when there are two agents or more, not on
agent 0. Agent 0 shares its node with the batch script (Slurm starts the batch step and
srun's task 0 on the allocation's first node), and the loss of the batch step ends the
job in Slurm's eyes whatever the launcher does: that loss takes the requeue rung. Any
other node, the controller's included, is replaced by a spare (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.wire_records import TakeoverEvidence

log = logging.getLogger("slurm_robust.launcher.control.failover")

#: How often a controller renews its lease.
LEASE_RENEW_S = 0.25


def first_controller_index(ntasks: int) -> int:
    """The agent that runs the first controller: 1, off the batch node, when it exists."""
    return 1 if ntasks > 1 else 0


def claim_path(paths: RunPaths, step_key: str, term: int) -> Path:
    return paths.root / f"term-{step_key}.{term}"


class Claimant(TypedDict):
    """Who claims a term (in the claim file, with the term and the time)."""

    agent: int
    node: str


class ControllerRecord(TypedDict, total=False):
    """``controller.json``: where this job step's controller listens, and its term. Read
    back from a file, so a reader checks ``key`` before trusting the rest."""

    key: str
    host: str
    port: int
    node: str
    pid: int
    time: float
    agent: int
    term: int


def lease_path(paths: RunPaths) -> Path:
    return paths.root / "controller.lease"


def claim_term(paths: RunPaths, step_key: str, term: int, who: Claimant) -> bool:
    """Try to become the controller of ``term``; True for exactly one caller per term."""
    path = claim_path(paths, step_key, term)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps({**who, "term": term, "time": time.time()}).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def superseded(paths: RunPaths, step_key: str, term: int) -> bool:
    """Whether a successor has claimed the next term (the caller must stand down)."""
    return claim_path(paths, step_key, term + 1).exists()


def renew_lease(paths: RunPaths, term: int) -> None:
    """Touch the lease (its mtime is what successors read); created on first use."""
    path = lease_path(paths)
    try:
        os.utime(path)
    except FileNotFoundError:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.write(fd, str(term).encode())
        os.close(fd)


def lease_age(paths: RunPaths, now: float | None = None) -> float | None:
    """Seconds since the lease was renewed (None: no lease yet)."""
    try:
        mtime = lease_path(paths).stat().st_mtime
    except FileNotFoundError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def candidates(members: dict[str, str], lost_agent: int | None) -> list[int]:
    """The agents that may succeed, in order of preference: lowest index first."""
    return sorted(int(i) for i in members if int(i) != lost_agent)


@dataclass
class Takeover:
    """What a successor's controller starts from: its term and the controller it replaces."""

    term: int
    lost_agent: int | None
    lost_node: str | None
    # Empty only in a takeover made by hand (a test's).
    evidence: TakeoverEvidence = field(default_factory=dict)
    #: When the successor last heard from the old controller (the fault time's bound).
    last_heard: float | None = None


class StoodDown(Exception):
    """Raised inside a controller that found a newer term: it must not act again."""
