"""A node lost while the peer backups run behind: a step common to every rank is still
there. Three ranks on three simulated nodes; every peer exchange is slowed (a loaded
machine or a congested network) so that the snapshots of the fast training loop
outrun their backups; the run dies right after a snapshot, without a flush, as a killed
job does. Each snapshot waits for the previous one's peer exchange and a rank keeps
three snapshots: the restore on a replacement node finds the step before the newest in
the survivors' memory and in the lost rank's backup (with two slots and no wait, the
backups ran two steps behind the survivors' snapshots and no common step was left)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slurm_robust import ckpt
from slurm_robust.ckpt import transport
from tests.unit.ckpt.helpers import (
    dist_worker,
    free_port,
    make_trainer,
    reference_params,
    resume,
    train,
)

WORLD = 3
JOB = "joblag"
JOB_DIR = f"{JOB}.u{os.geteuid()}"
SLOW_EXCHANGE_S = 0.3


def slow_worker(rank: int, world: int, port: int, cfg: ckpt.CheckpointConfig,
                nodes: list[str], until: int) -> None:
    """Train to ``until`` with every peer exchange slowed, then die at once (no flush)."""
    real = transport.Transport.transfer

    def slowed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(SLOW_EXCHANGE_S)
        return real(self, *args, **kwargs)

    transport.Transport.transfer = slowed  # type: ignore[method-assign]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    mgr = ckpt.CheckpointManager(cfg, rank, world, nodes[rank], JOB)
    t = make_trainer(rank)
    resume(t, mgr)
    train(t, rank, until, mgr, reduce_group=True)
    os._exit(0)  # killed right after its newest snapshot: nothing flushed, nothing closed


def test_a_node_lost_while_backups_lag_still_leaves_a_common_step(tmp_path: Path) -> None:
    cfg = ckpt.CheckpointConfig(shm_root=str(tmp_path / "shm"), chunk_bytes=4096)
    crash_at, steps = 6, 9
    mp.spawn(slow_worker, args=(WORLD, free_port(), cfg, ["nodeA", "nodeB", "nodeC"],
                                crash_at), nprocs=WORLD, join=True)
    ckpt.purge_job_memory(cfg, JOB_DIR, "nodeC")  # nodeC is lost with rank 2
    mp.spawn(dist_worker, args=(WORLD, free_port(), cfg, ["nodeA", "nodeB", "nodeD"], JOB,
                                steps, False, str(tmp_path)), nprocs=WORLD, join=True)
    for rank in range(WORLD):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert res["step"] in (crash_at - 1, crash_at - 2), res["step"]
        assert res["tiers"][2] == "peer" and res["tiers"][0] == "memory", res["tiers"]
        ref = reference_params(rank, steps)
        assert all(torch.equal(a, b) for a, b in zip(res["params"], ref, strict=True)), rank
