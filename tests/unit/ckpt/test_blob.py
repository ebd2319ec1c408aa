"""The snapshot format: completion mark, checksums, skeleton round trip, paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slurm_robust import ckpt
from slurm_robust.ckpt.blob import (
    CorruptCopyError,
    checksum,
    decode_meta,
    encode_meta,
    encode_skeleton,
    flatten,
    pack_layout,
    unflatten,
)
from slurm_robust.errors import UsageError


@pytest.mark.parametrize("algo", ["crc32", "sum64"])
def test_checksums_see_a_flipped_bit_and_a_torn_copy(algo):
    data = np.random.default_rng(0).integers(0, 255, 1 << 16, dtype=np.uint8)
    good = checksum(algo, data)
    flipped = data.copy()
    flipped[12345] ^= 1
    torn = data.copy()
    torn[len(torn) // 2:] = 0
    assert checksum(algo, flipped) != good
    assert checksum(algo, torn) != good


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_sum64_split_over_threads_equals_one_thread_and_sees_a_flip(threads):
    # Large enough that each thread gets a share (the split starts at 64 MiB a thread),
    # and not a multiple of the thread count, so the last share is uneven.
    data = np.random.default_rng(1).integers(0, 255, (threads * 64 << 20) + 8 * 7,
                                             dtype=np.uint8)
    one = checksum("sum64", data, 1)
    assert checksum("sum64", data, threads) == one
    data[-1] ^= 0x80
    assert checksum("sum64", data, threads) != one


def test_meta_round_trip_and_damage():
    state = {"a": torch.ones(3), "b": [1, (2, torch.zeros(2))], "c": "x"}
    skeleton, tensors = flatten(state, torch.Tensor)
    assert len(tensors) == 2
    header = {"step": 3, "rank": 0, "world_size": 1, "layout": {}, "nbytes": 128,
              "checksum_algo": "sum64", "checksum": 0,
              "tensors": [["float32", [3], 0, 12], ["float32", [2], 64, 8]]}
    raw = encode_meta(header, encode_skeleton(skeleton))
    header, skel = decode_meta(raw)
    assert header["step"] == 3
    back = unflatten(skel, tensors)
    assert back["c"] == "x" and back["b"][1][1] is tensors[1]
    damaged = bytearray(raw)
    damaged[-3] ^= 0xFF
    with pytest.raises(CorruptCopyError):
        decode_meta(bytes(damaged))
    with pytest.raises(CorruptCopyError):
        decode_meta(raw[: len(raw) // 2])


def test_layout_is_aligned():
    specs, total = pack_layout([("float32", (3,), 12), ("uint8", (1,), 1), ("float64", (), 8)])
    assert [s.offset for s in specs] == [0, 64, 128]
    assert total == 192


def test_paths_carry_job_and_node_and_refuse_traversal(tmp_path):
    cfg = ckpt.CheckpointConfig(shm_root=str(tmp_path / "shm"), local_root=str(tmp_path / "l"))
    paths = ckpt.config.CkptPaths(cfg, "123", "node4", 2)
    assert paths.slot(1) == tmp_path / "shm/123/node4/rank2/slot1"
    assert paths.local(5) == tmp_path / "l/node4/123/rank2/step0000000005"
    with pytest.raises(UsageError):
        ckpt.config.CkptPaths(cfg, "../etc", "node4", 0)
    with pytest.raises(UsageError, match="durable_root"):
        ckpt.CheckpointConfig(durable_every=5)


def test_purge_removes_only_that_node(tmp_path):
    cfg = ckpt.CheckpointConfig(shm_root=str(tmp_path))
    for node in ("a", "b"):
        ckpt.config.ensure_dir(tmp_path / "j" / node / "rank0", tmp_path)
        (tmp_path / "j" / node / "rank0" / "slot0.data").write_bytes(b"x" * 10)
    assert ckpt.purge_job_memory(cfg, "j", "a") == 10
    assert not (tmp_path / "j" / "a").exists() and (tmp_path / "j" / "b").exists()


def test_purge_never_walks_into_a_directory_it_does_not_own(tmp_path):
    cfg = ckpt.CheckpointConfig(shm_root=str(tmp_path))
    (tmp_path / "j" / "a").mkdir(parents=True, mode=0o755)  # not private: not ours
    (tmp_path / "j" / "a" / "keep").write_bytes(b"x")
    assert ckpt.purge_job_memory(cfg, "j", "a") == 0
    assert (tmp_path / "j" / "a" / "keep").exists()
