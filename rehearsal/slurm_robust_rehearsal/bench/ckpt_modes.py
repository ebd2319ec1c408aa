"""The training loop and checkpoint modes behind ``slurm-robust bench ckpt``."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from slurm_robust.ckpt.blob import checksum
from slurm_robust.ckpt.config import CheckpointConfig, job_dir_name, purge_job_memory
from slurm_robust.ckpt.manager import CheckpointManager, CheckpointStats
from slurm_robust.ckpt.state import capture_state
from slurm_robust_rehearsal.workloads.gpt import GPT, GPTConfig, n_params

SHM_ROOT = "/dev/shm/slurm_robust_bench"


def gpt_config(params: dict[str, Any]) -> GPTConfig:
    return GPTConfig(vocab=params["vocab"], d_model=params["d_model"],
                     n_layers=params["n_layers"], n_heads=8, seq=params["seq"])


class ModeRunner:
    """One rank's model, optimizer, data and one object per checkpoint mode."""

    def __init__(self, rank: int, world: int, params: dict[str, Any], algo: str,
                 work: str) -> None:
        torch.manual_seed(0)
        self.rank, self.params, self.work = rank, params, work
        self.cfg = gpt_config(params)
        self.model = GPT(self.cfg)
        self.n_params = n_params(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1000)
        self.gen = torch.Generator().manual_seed(rank)
        self.step_no = 0
        self.job = f"bench{os.getpid()}" if rank == 0 else ""
        job = [self.job]
        dist.broadcast_object_list(job, src=0)
        self.job = str(job[0])
        nodes = [f"benchnode{r}" for r in range(world)]
        base = dict(shm_root=SHM_ROOT, checksum=algo)
        self.managers = {
            "snapshot": CheckpointManager(CheckpointConfig(**base, peer_backup=False), rank,
                                          world, nodes[rank], self.job + "-snap",
                                          rank_nodes=nodes),
            "snapshot_peer": CheckpointManager(CheckpointConfig(**base, peer_backup=True),
                                               rank, world, nodes[rank], self.job + "-peer",
                                               rank_nodes=nodes),
        }
        self.dcp_group = dist.new_group(backend="gloo")
        self.dcp_future: Any = None
        self.dcp_dirs: list[str] = []

    def steps(self, mode: str, n: int) -> None:
        for _ in range(n):
            self._step(mode)

    def _step(self, mode: str) -> None:
        idx = torch.randint(0, self.cfg.vocab, (self.params["batch"], self.cfg.seq + 1),
                            generator=self.gen)
        self.model.loss(idx).backward()
        for p in self.model.parameters():  # data parallel: average the gradients
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())
        mgr = self.managers.get(mode)
        if mgr is not None:
            mgr.wait()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        self.sched.step()
        self.step_no += 1
        if mode == "none":
            return
        if mgr is not None:
            mgr.snapshot(self.step_no, self._state())
        elif mode == "torch_save":
            torch.save(self._state(), os.path.join(self.work, f"torch_save_rank{self.rank}.pt"))
        elif mode == "dcp_async_save":
            self._dcp_save()

    def _state(self) -> dict[str, Any]:
        return capture_state(self.model, self.opt, self.sched, data_position=self.step_no)

    def _dcp_save(self) -> None:
        if self.dcp_future is not None:
            self.dcp_future.result()
            self._prune_dcp()
        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        path = os.path.join(self.work, f"dcp_step{self.step_no}")
        self.dcp_dirs.append(path)
        self.dcp_future = dcp.async_save({"model": model_sd, "optim": optim_sd},
                                         checkpoint_id=path, process_group=self.dcp_group)

    def _prune_dcp(self) -> None:
        while len(self.dcp_dirs) > 1:
            old = self.dcp_dirs.pop(0)
            if self.rank == 0:
                shutil.rmtree(old, ignore_errors=True)

    def drain(self, mode: str) -> None:
        if mode in self.managers:
            self.managers[mode].flush()
        elif mode == "dcp_async_save" and self.dcp_future is not None:
            self.dcp_future.result()
            self.dcp_future = None

    def reset_stats(self) -> None:
        for mgr in self.managers.values():
            mgr.stats = CheckpointStats(state_bytes=mgr.stats.state_bytes)

    def blocking_per_step(self) -> dict[str, float]:
        return {m: mgr.stats.blocking_s / max(mgr.stats.snapshots, 1)
                for m, mgr in self.managers.items()}

    def state_bytes(self) -> int:
        return self.managers["snapshot"].stats.state_bytes

    def host_bytes(self) -> dict[str, int]:
        return {m: mgr.host_bytes() for m, mgr in self.managers.items()}

    def close(self) -> None:
        for name, mgr in self.managers.items():
            mgr.close(timeout=120)
            purge_job_memory(mgr.config, mgr.paths.job_id, mgr.paths.node)
            del name
        if self.dcp_future is not None:
            self.dcp_future.result()


def copy_bandwidth(params: dict[str, Any], algo: str, repeats: int = 5) -> dict[str, Any]:
    """Snapshot copy (the real manager, world of one) beside memcpy of the same bytes."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT(gpt_config(params))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.loss(torch.randint(0, params["vocab"], (1, 9))).backward()
    opt.step()
    state = capture_state(model, opt, None, data_position=0)
    job = f"copybench{os.getpid()}"
    cfg = CheckpointConfig(shm_root=SHM_ROOT, peer_backup=False, checksum=algo)
    mgr = CheckpointManager(cfg, 0, 1, "copynode", job)
    try:
        mgr.snapshot(0, state)  # allocates and faults in the buffers
        mgr.flush()
        nbytes = mgr.stats.state_bytes
        src = torch.ones(nbytes, dtype=torch.uint8)
        copy_s, memcpy_s = [], []
        with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
            dst = torch.from_file(os.path.join(tmp, "dst"), shared=True, size=nbytes,
                                  dtype=torch.uint8)
            dst.zero_()
            for i in range(1, repeats + 1):  # interleaved, so load changes hit both
                before = mgr.stats.copy_s
                mgr.snapshot(i, state)
                mgr.wait()
                mgr.flush()
                copy_s.append(mgr.stats.copy_s - before)
                t0 = time.perf_counter()
                dst.copy_(src)
                memcpy_s.append(time.perf_counter() - t0)
            sums = {}
            for name in ("crc32", "sum64"):
                t0 = time.perf_counter()
                checksum(name, dst.numpy())
                sums[name] = nbytes / (time.perf_counter() - t0) / 1e9
            del dst
    finally:
        mgr.close()
        purge_job_memory(cfg, job_dir_name(cfg, job))
    snap = nbytes / statistics.median(copy_s) / 1e9
    mem = nbytes / statistics.median(memcpy_s) / 1e9
    return {"bytes": nbytes, "tensors": len(mgr._spec_objs), "snapshot_GBps": snap,
            "memcpy_GBps": mem, "snapshot_vs_memcpy": snap / mem,
            "checksum_GBps": sums}
