"""Peer backup across simulated nodes: 4 ranks on gloo, ranks 0-1 on nodeA, 2-3 on nodeB."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.multiprocessing as mp

from slurm_robust import ckpt
from slurm_robust.ckpt.blob import read_meta
from tests.unit.ckpt.helpers import dist_worker, free_port, reference_params

WORLD = 4
JOB = "job42"
#: The directory a job outside the launcher gets (ckpt.config.job_dir_name).
JOB_DIR = f"{JOB}.u{os.geteuid()}"


def spawn(cfg: ckpt.CheckpointConfig, nodes: list[str], until: int, crash: bool,
          out: Path) -> dict[int, dict]:
    mp.spawn(dist_worker, args=(WORLD, free_port(), cfg, nodes, JOB, until, crash, str(out)),
             nprocs=WORLD, join=True)
    if crash:
        return {}
    return {r: torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(WORLD)}


def test_lost_node_restores_from_peer_backup_bit_identical(tmp_path):
    cfg = ckpt.CheckpointConfig(shm_root=str(tmp_path / "shm"),
                                local_root=str(tmp_path / "local"), local_every=2,
                                chunk_bytes=4096)  # several chunks per transfer
    crash_at, steps = 5, 9
    # Phase 1: train to step 5 and die without closing.
    spawn(cfg, ["nodeA", "nodeA", "nodeB", "nodeB"], crash_at, crash=True, out=tmp_path)
    # nodeB is lost: its shared memory and its local disk are gone.
    ckpt.purge_job_memory(cfg, JOB_DIR, "nodeB")
    shutil.rmtree(tmp_path / "local" / "nodeB")
    # Phase 2: ranks 2 and 3 come back on a replacement node.
    out = spawn(cfg, ["nodeA", "nodeA", "nodeC", "nodeC"], steps, crash=False, out=tmp_path)
    for rank in range(WORLD):
        res = out[rank]
        assert res["step"] == crash_at
        assert res["tiers"] == {0: "memory", 1: "memory", 2: "peer", 3: "peer"}
        assert res["peer"] == {0: 2, 1: 3, 2: 0, 3: 1}[rank]
        assert res["stats"]["peer_sends"] == steps - crash_at
        ref = reference_params(rank, steps)
        assert all(torch.equal(a, b) for a, b in zip(res["params"], ref, strict=True)), rank
    # The backups themselves sit on the other node, under the holder's paths.
    backup = read_meta(tmp_path / "shm" / JOB_DIR / "nodeA" / "rank0" / "backup0")[0]
    assert (backup["rank"], backup["step"]) == (2, steps)
