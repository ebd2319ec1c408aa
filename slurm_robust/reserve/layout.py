"""``reserve reset``: put the reserve and train partitions back to their configured members.

Handoffs move spares into a job's partition and reconcile refills the reserve from idle
train nodes, so membership drifts from slurm.conf (the train
partition kept shrinking until an undocumented ``scontrol reconfigure``, which also
resets every other partition). Reset restores only the partitions the reserve manages,
to the ``Nodes=`` of their ``PartitionName=`` lines in slurm.conf, through the same
executor (logged, under the reserve lock). A node moved keeps any job it runs: partition
membership only steers new jobs.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.reserve.config import ReserveConfig
from slurm_robust.reserve.executor import Executor
from slurm_robust.reserve.gate import HealthGate
from slurm_robust.reserve.lock import reserve_lock
from slurm_robust.reserve.plan import Move, Snapshot
from slurm_robust.reserve.reconcile import take_snapshot
from slurm_robust.slurm import Slurm, expand_hostlist


def slurm_conf_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


def configured_partitions(conf_text: str, names: Iterable[str]) -> dict[str, list[str]]:
    """``Nodes=`` of the ``PartitionName=`` lines for ``names`` (pure)."""
    wanted, out = set(names), {}
    for raw in conf_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.lower().startswith("partitionname="):
            continue
        fields = dict(f.split("=", 1) for f in shlex.split(line) if "=" in f)
        lower = {k.lower(): v for k, v in fields.items()}
        name = lower.get("partitionname", "")
        if name in wanted:
            out[name] = expand_hostlist(lower.get("nodes", ""))
    missing = sorted(wanted - set(out))
    if missing:
        raise UsageError(f"slurm.conf has no PartitionName line for {missing}; cannot "
                         "restore their configured members")
    return out


def plan_reset(snap: Snapshot, configured: Mapping[str, list[str]]) -> list[Move]:
    """Moves that make each managed partition hold exactly its configured nodes (a node
    configured in none of them stays where it is)."""
    home = {n: p for p, nodes in configured.items() for n in nodes}
    moves = []
    for node, dst in sorted(home.items()):
        now_in = tuple(p for p in configured if node in snap.partitions.get(p, ()))
        wrong = tuple(p for p in now_in if p != dst)
        if dst not in now_in or wrong:
            moves.append(Move(node, wrong, dst, f"restore configured membership ({dst})"))
    return moves


def reset(slurm: Slurm, gate: HealthGate, cfg: ReserveConfig, conf_text: str,
          dry_run: bool = False, clock: Callable[[], float] | None = None
          ) -> list[dict[str, Any]]:
    """Restore the reserve and train partitions' configured members; returns outcomes."""
    clock = clock or time.time
    configured = configured_partitions(conf_text, (cfg.partition, *cfg.train_partitions))
    with reserve_lock(cfg.lock_file, cfg.lock_timeout_s):
        snap = take_snapshot(slurm, gate, cfg, clock())
        moves = plan_reset(snap, configured)
        return Executor(slurm, gate, cfg.log_file, "reset", dry_run, clock).apply(moves)
