"""Rehearsal NaN sources that a replay tells apart, for a running robust job.

=====================  ==============================================================
``nan --mode data``    a poisoned sample: one rank's batch at a step a few steps ahead
                       makes its gradients NaN, on that step of every replay (the data
                       or the model: the NaN ladder stops or skips it)
``sdc --node N``       silent data corruption: every rank of node N corrupts a gradient
                       before the collective at random steps, a new draw per attempt,
                       so the NaN moves between replays
=====================  ==============================================================

Both write their file under ``<run_dir>/nan/`` (read by slurm_robust.train at every
worker start, so the fault survives restarts) and then send SIGUSR1 to the running
workers concerned, which makes them reload it now (see train.py).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from slurm_robust.launcher.errors import InjectionError
from slurm_robust.launcher.node.nan_local import (
    NAN_FILES_VERSION,
    POISON_FILE,
    SDC_FILE,
    nan_dir,
)
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit.status import run_status
from slurm_robust.run_dir_trust import write_json_as_owner
from slurm_robust.stacks import procfs

#: The poisoned step is this many steps past the last one the controller logged: far
#: enough that the signalled worker has reloaded the file before it computes that step.
AHEAD_STEPS = 5


def _signal_workers(run_dir: str, job_id: str, node: str | None, rank: int | None,
                    pick: Any, owner: int | None = None) -> list[tuple[str, int, int]]:
    agents = RunPaths.of(run_dir).read_agents(owner)
    hit = []
    for n, a in agents.items():
        for r, p in (a.get("workers") or {}).items():
            if (node is None or n == node) and (rank is None or int(r) == rank):
                hit.append((n, int(r), int(p)))
    hit = [h for h in hit if pick(h[2])]
    if not hit:
        raise InjectionError(f"no running worker of job {job_id} matches node={node} "
                             f"rank={rank} in {run_dir}/agents")
    for _, _, pid in hit:
        if not procfs.catches_signal(pid, signal.SIGUSR1):
            raise InjectionError(f"worker {pid} does not handle SIGUSR1: it does not use "
                                 "slurm_robust.train")
        os.kill(pid, signal.SIGUSR1)
    return hit


def _write(run_dir: str, name: str, record: dict[str, Any], owner: int | None) -> None:
    # The workers read only their own user's files (nan_local.read_json): written by the
    # job's user, not by root into the user's directory (run_dir_trust).
    if owner is None:
        owner = os.stat(run_dir).st_uid
    write_json_as_owner(nan_dir(run_dir), name, record, owner)


def inject_data_nan(job_id: str, run_dir: str, rank: int, node: str | None,
                    pick: Any, owner: int | None = None) -> dict[str, Any]:
    step = (run_status(run_dir).get("step") or 0) + AHEAD_STEPS
    now = time.time()
    record = {"v": NAN_FILES_VERSION, "id": f"data-{now:.3f}", "rank": rank, "step": step,
              "time": now}
    _write(run_dir, POISON_FILE, record, owner)
    hit = _signal_workers(run_dir, job_id, node, rank, pick, owner)
    return {"mode": "data", "node": hit[0][0], "rank": rank, "pid": hit[0][2],
            "poison_step": step}


def inject_sdc(job_id: str, run_dir: str, node: str, probability: float, bitwise: bool,
               pick: Any, owner: int | None = None) -> dict[str, Any]:
    if not 0 < probability <= 1:
        raise InjectionError(f"sdc: probability {probability} must be in (0, 1]")
    now = time.time()
    record = {"v": NAN_FILES_VERSION, "id": f"sdc-{now:.3f}", "node": node,
              "probability": probability, "seed": int(now * 1000) % 100_000,
              "bitwise": bitwise, "time": now}
    _write(run_dir, SDC_FILE, record, owner)
    hit = _signal_workers(run_dir, job_id, node, None, pick, owner)
    return {"node": node, "ranks": sorted(r for _, r, _ in hit),
            "probability": probability, "bitwise": bitwise}
