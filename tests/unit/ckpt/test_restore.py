"""Restore on one rank: worker crash, corrupt and torn copies, lost memory tiers."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
import torch

from slurm_robust import ckpt
from slurm_robust.ckpt.blob import read_meta
from tests.unit.ckpt.helpers import make_trainer, params, reference_params, resume, train

STEPS = 12
RANK = 0
#: The directory a job outside the launcher gets (ckpt.config.job_dir_name).
JOB_DIR = f"job7.u{os.geteuid()}"


def config(tmp_path: Path, **kw: object) -> ckpt.CheckpointConfig:
    base = dict(shm_root=str(tmp_path / "shm"), local_root=str(tmp_path / "local"),
                durable_root=str(tmp_path / "durable"), local_every=3, durable_every=4,
                keep_local=2, keep_durable=2, peer_backup=False)
    base.update(kw)
    return ckpt.CheckpointConfig(**base)  # type: ignore[arg-type]


def manager(cfg: ckpt.CheckpointConfig, node: str = "nodeA") -> ckpt.CheckpointManager:
    return ckpt.CheckpointManager(cfg, RANK, 1, node, "job7")


def run_until(cfg: ckpt.CheckpointConfig, until: int) -> None:
    """Train from scratch to ``until`` with checkpoints, flush, and drop the manager."""
    mgr = manager(cfg)
    t = make_trainer(RANK)
    assert resume(t, mgr).fresh
    train(t, RANK, until, mgr)
    mgr.close()


def finish(cfg: ckpt.CheckpointConfig, node: str = "nodeA") -> tuple[ckpt.RestoreResult,
                                                                   list[torch.Tensor]]:
    """Restore, train to STEPS, return the restore result and final parameters."""
    mgr = manager(cfg, node)
    t = make_trainer(RANK, seed=99)  # different init: only the restore can make it right
    result = resume(t, mgr)
    train(t, RANK, STEPS, mgr)
    mgr.close()
    return result, params(t)


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y), "final parameters differ from the uninterrupted run"


@pytest.fixture(scope="module")
def reference() -> list[torch.Tensor]:
    torch.set_num_threads(1)
    return reference_params(RANK, STEPS)


def _crashing_worker(cfg: ckpt.CheckpointConfig, until: int) -> None:
    torch.set_num_threads(1)
    mgr = manager(cfg)
    t = make_trainer(RANK)
    resume(t, mgr)
    train(t, RANK, until, mgr)
    mgr.flush()
    os.kill(os.getpid(), 9)  # SIGKILL: no close(), no atexit, nothing flushed by Python


@pytest.mark.parametrize("crash_at", [1, 7])
def test_worker_crash_restores_from_shared_memory(tmp_path, reference, crash_at):
    cfg = config(tmp_path, local_root=None, local_every=0, durable_root=None, durable_every=0)
    proc = multiprocessing.get_context("spawn").Process(target=_crashing_worker,
                                                        args=(cfg, crash_at))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -9
    result, final = finish(cfg)
    assert (result.step, result.tiers) == (crash_at, {0: "memory"})
    assert_same(final, reference)


def test_snapshot_after_wait_is_not_torn_by_the_next_optimizer_step(tmp_path):
    cfg = config(tmp_path, local_every=0, durable_every=0)
    big = torch.arange(16 << 20, dtype=torch.float32)  # 64 MiB: the copy takes a while
    expected = big.clone()
    mgr = manager(cfg)
    mgr.snapshot(1, {"w": big})
    mgr.wait()
    big.add_(1.0)  # what optimizer.step() does right after wait()
    mgr.close()
    result = manager(cfg).restore()
    assert result.step == 1
    assert torch.equal(result.state["w"], expected)


@pytest.mark.parametrize("disk, expected", [
    (True, (8, {0: "durable"})),   # the same step from a later tier
    (False, (7, {0: "memory"})),   # no other copy of step 8: the older memory slot
])
def test_corrupt_newest_memory_copy_is_skipped(tmp_path, reference, disk, expected):
    cfg = config(tmp_path) if disk else config(tmp_path, local_every=0, durable_every=0)
    run_until(cfg, 8)
    slot = max((tmp_path / "shm" / JOB_DIR / "nodeA/rank0").glob("slot*.meta"),
               key=lambda p: read_meta(p.with_suffix(""))[0]["step"])
    data = slot.with_suffix(".data")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 3] ^= 0x40  # one flipped bit in the newest copy
    data.write_bytes(bytes(raw))
    result, final = finish(cfg)
    assert (result.step, result.tiers) == expected
    assert_same(final, reference)


def test_torn_copy_without_completion_mark_is_never_loaded(tmp_path, reference):
    cfg = config(tmp_path)
    run_until(cfg, 6)
    for meta in (tmp_path / "shm" / JOB_DIR / "nodeA/rank0").glob("slot*.meta"):
        header, _ = read_meta(meta.with_suffix(""))
        if header["step"] == 6:
            meta.unlink()  # a crash between the data copy and the completion mark
    result, final = finish(cfg)
    assert result.step == 6 and result.tiers == {0: "local"}  # local tier: every 3 steps
    assert_same(final, reference)


def test_lost_memory_falls_back_to_local_then_durable(tmp_path, reference):
    cfg = config(tmp_path)
    run_until(cfg, 10)
    ckpt.purge_job_memory(cfg, JOB_DIR, "nodeA")
    result, final = finish(cfg)
    assert (result.step, result.tiers) == (9, {0: "local"})
    assert_same(final, reference)

    cfg2 = config(tmp_path / "second")
    run_until(cfg2, 10)
    ckpt.purge_job_memory(cfg2, JOB_DIR)
    shutil.rmtree(tmp_path / "second" / "local" / "nodeA")  # the node and its disk are gone
    result, final = finish(cfg2, node="nodeB")
    assert (result.step, result.tiers) == (8, {0: "durable"})
    assert_same(final, reference)


def test_corrupt_disk_copy_falls_back_to_an_older_valid_step(tmp_path, reference):
    cfg = config(tmp_path, durable_root=None, durable_every=0)
    run_until(cfg, 7)
    ckpt.purge_job_memory(cfg, JOB_DIR)
    newest = tmp_path / "local/nodeA" / JOB_DIR / "rank0/step0000000006.data"
    with open(newest, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xfe")
    result, final = finish(cfg)
    assert (result.step, result.tiers, result.attempts) == (3, {0: "local"}, 2)
    assert_same(final, reference)


def test_no_valid_step_is_a_clear_error(tmp_path):
    cfg = config(tmp_path, local_every=0, durable_every=0)
    run_until(cfg, 2)
    for data in (tmp_path / "shm" / JOB_DIR / "nodeA/rank0").glob("slot*.data"):
        data.write_bytes(b"\0" * data.stat().st_size)
    with pytest.raises(ckpt.NoValidCheckpointError, match="no step has a valid checkpoint"):
        manager(cfg).restore()


def test_fresh_start_and_buffers_are_reused(tmp_path):
    cfg = config(tmp_path, local_every=0, durable_every=0)
    mgr = manager(cfg)
    assert mgr.restore().fresh
    t = make_trainer(RANK)
    train(t, RANK, 2, mgr)
    first = [s.flat.data_ptr() for s in mgr._slots]
    train(t, RANK, 6, mgr)
    assert [s.flat.data_ptr() for s in mgr._slots] == first
    state_bytes = mgr.stats.state_bytes
    assert mgr.host_bytes() == 2 * state_bytes
    mgr.close()


def test_restore_own_loads_this_ranks_copy_of_a_given_step_without_a_collective(tmp_path):
    """A dual-phase replay's restore: the controller names the step; the rank reads its
    own copy (memory first), with no process group; a step it has no copy of is an
    error that says so."""
    from slurm_robust.ckpt.config import CkptPaths
    from slurm_robust.ckpt.restore import restore_own
    from slurm_robust.layout import ParallelLayout

    cfg = config(tmp_path)
    run_until(cfg, 6)
    paths = CkptPaths(cfg, JOB_DIR, "nodeA", RANK)
    layout = ParallelLayout.data_parallel(1).as_dict()
    res = restore_own(paths, 1, layout, cfg.peer_slots, 5)  # the older memory slot
    assert res.step == 5 and res.tiers == {RANK: "memory"}
    assert res.state["data_position"] is not None
    with pytest.raises(ckpt.CheckpointError, match="no loadable copy of step 2"):
        restore_own(paths, 1, layout, cfg.peer_slots, 2)
