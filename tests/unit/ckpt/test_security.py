"""Checkpoint copies are data, never code; planted directories, links and damaged copies
are refused or skipped."""

from __future__ import annotations

import os
import pickle
import random
import stat
import struct
import zlib

import numpy as np
import pytest
import torch

from slurm_robust import ckpt
from slurm_robust.ckpt.blob import MAGIC, CorruptCopyError, decode_meta, read_meta
from slurm_robust.errors import SlurmRobustError
from slurm_robust.secure_fs import UnsafePathError

NOBODY = 65534
JOB = "42.secretkey"


def _cfg(tmp_path, **kw):
    kw.setdefault("local_every", 1)
    kw.setdefault("keep_local", 3)
    kw.setdefault("job_key", JOB)  # the launcher's keyed directory name
    return ckpt.CheckpointConfig(shm_root=str(tmp_path / "shm"),
                                 local_root=str(tmp_path / "local"), peer_backup=False,
                                 pin_memory=False, **kw)


def _state(step: int) -> dict:
    return {"w": torch.arange(40, dtype=torch.float32) * step,
            "opt": {0: {"step": torch.tensor(float(step))}, "lr": 0.1 / step,
                    "groups": [{"params": [0, 1], "nan": float("nan")}]},
            "rng": ("MT19937", np.arange(8, dtype=np.uint32) + step, step, 0, 0.0),
            "extras": {"step": step, "blob": b"\x00\xff"}}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b) and a.dtype == b.dtype
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k])
                                                                    for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return a == b


def _snapshot_steps(cfg, steps, job=JOB):
    mgr = ckpt.CheckpointManager(cfg, 0, 1, "nodeA", job)
    for step in steps:
        mgr.snapshot(step, _state(step))
        mgr.flush()
    mgr.close()


def _restore(cfg, job=JOB):
    mgr = ckpt.CheckpointManager(cfg, 0, 1, "nodeA", job)
    try:
        return mgr.restore()
    finally:
        mgr.close()


def test_state_round_trips_without_pickle(tmp_path):
    cfg = _cfg(tmp_path)
    _snapshot_steps(cfg, [1, 2])
    res = _restore(cfg)
    assert res.step == 2 and _same(res.state, _state(2))


def test_a_pickle_in_the_meta_file_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    payload = pickle.dumps(Evil())
    hbytes = b'{"format": 2}'
    raw = MAGIC + struct.pack(">QI", len(hbytes), zlib.crc32(hbytes)) + hbytes + payload
    with pytest.raises(CorruptCopyError):
        decode_meta(raw)
    old = b"SRCKPT1\n" + struct.pack(">Q", len(hbytes)) + hbytes + payload
    with pytest.raises(CorruptCopyError):
        decode_meta(old)
    assert not marker.exists()


def test_a_directory_planted_by_another_user_is_refused(tmp_path):
    cfg = _cfg(tmp_path)
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o755)
    os.chmod(shm, 0o1777)
    planted = shm / JOB
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match="owned by uid"):
        _snapshot_steps(cfg, [1])
    # restore skips the planted tier (fresh start) instead of reading it
    assert _restore(cfg).step is None


def test_a_planted_symlink_is_never_followed(tmp_path):
    cfg = _cfg(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "rank0").mkdir(mode=0o700)
    (tmp_path / "shm").mkdir()
    os.chmod(tmp_path / "shm", 0o1777)
    (tmp_path / "shm" / JOB).mkdir(mode=0o700)
    os.symlink(victim, tmp_path / "shm" / JOB / "nodeA")
    with pytest.raises(UnsafePathError, match="symlink"):
        _snapshot_steps(cfg, [1])
    assert list(victim.iterdir()) == [victim / "rank0"]


def test_a_symlinked_data_file_is_skipped(tmp_path):
    cfg = _cfg(tmp_path, local_every=0)
    _snapshot_steps(cfg, [1, 2])
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    mem = tmp_path / "shm" / JOB / "nodeA" / "rank0"
    newest = max(mem.glob("slot*.meta"), key=lambda p: read_meta(p.with_suffix(""))[0]["step"])
    data = newest.with_suffix(".data")
    data.unlink()
    os.symlink(target, data)
    res = _restore(cfg)
    assert res.step == 1 and _same(res.state, _state(1))
    assert target.read_bytes() == b"keep"


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    kind = rng.choices(["flip", "truncate", "header", "extend", "zero"],
                       weights=[2, 2, 5, 1, 2])[0]
    buf = bytearray(raw)
    if kind == "flip" and buf:
        i = rng.randrange(len(buf))
        buf[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del buf[rng.randrange(len(buf) + 1):]
    elif kind == "header":
        # An edit inside the JSON header. Structural damage may come with a recomputed
        # header CRC (validation must catch it); a plausible edit of step or rank keeps
        # the stale CRC (with a fresh one it would be a deliberate forgery by the owner).
        start = len(MAGIC) + 12
        if len(buf) < start:
            return bytes(buf)
        hlen, old_crc = struct.unpack_from(">QI", buf, len(MAGIC))
        head = bytes(buf[start:start + hlen])
        plausible = rng.random() < 0.3
        edits = ((b'"step": ', b'"step": 9'), (b'"rank": 0', b'"rank": 7')) if plausible \
            else ((b'"nbytes": ', b'"nbytes": 1'), (b'"tensors": [[', b'"tensors": [[1, '),
                  (b'"checksum_algo": "sum64"', b'"checksum_algo": 5'),
                  (b'"format": 2', b'"x": 2'), (b'"skeleton_len": ', b'"skeleton_len": -'),
                  (b'[40]', b'[4000000000000]'), (b'"float32"', b'"__class__"'))
        old, new = rng.choice(edits)  # one edit, so that none masks another
        head = head.replace(old, new, 1)
        crc = old_crc if plausible else zlib.crc32(head)
        buf = bytearray(raw[:len(MAGIC)] + struct.pack(">QI", len(head), crc) + head
                        + raw[start + hlen:])
    elif kind == "extend":
        buf += bytes(rng.randrange(1, 64))
    elif kind == "zero" and buf:
        i = rng.randrange(len(buf))
        buf[i:i + 64] = bytes(len(buf[i:i + 64]))
    return bytes(buf)


def test_fuzzed_copies_restore_the_right_state_or_are_skipped(tmp_path):
    rng = random.Random(1234)
    for trial in range(150):
        root = tmp_path / f"t{trial}"
        cfg = _cfg(root)
        _snapshot_steps(cfg, [1, 2, 3])
        mem = root / "shm" / JOB / "nodeA" / "rank0"
        local = root / "local" / "nodeA" / JOB / "rank0"
        files = sorted(mem.glob("slot*.*")) + sorted(local.glob("step*.*"))
        # The newest copies are the ones restore tries first: damage them most often.
        newest = [p for p in files if read_meta(p.with_suffix(""))[0]["step"] == 3] \
            if rng.random() < 0.7 else []
        for path in {*rng.sample(files, rng.randint(1, 4)), *newest}:
            path.write_bytes(_mutate(rng, path.read_bytes()))
        try:
            res = _restore(cfg)
        except ckpt.NoValidCheckpointError:
            continue  # every copy of every step was damaged: the one allowed error
        except SlurmRobustError as exc:  # pragma: no cover - the failure this test hunts
            pytest.fail(f"trial {trial}: restore raised {exc!r}")
        assert res.step in (1, 2, 3), trial
        assert _same(res.state, _state(res.step)), trial


def test_outside_the_launcher_the_job_directory_carries_the_uid(tmp_path):
    # A squatter who pre-creates the plain job id's directory is simply not in the way.
    cfg = _cfg(tmp_path, job_key=None)
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o755)
    os.chmod(shm, 0o1777)
    (shm / "77").mkdir(mode=0o700)
    os.chown(shm / "77", NOBODY, NOBODY)
    _snapshot_steps(cfg, [1], job="77")
    mine = shm / f"77.u{os.geteuid()}"
    assert mine.is_dir() and os.stat(mine).st_uid == os.geteuid()
    assert _restore(cfg, job="77").step == 1


def test_a_squatted_uid_directory_is_refused_naming_its_owner(tmp_path):
    cfg = _cfg(tmp_path, job_key=None)
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o755)
    os.chmod(shm, 0o1777)
    squat = shm / f"78.u{os.geteuid()}"
    squat.mkdir(mode=0o700)
    os.chown(squat, NOBODY, NOBODY)
    with pytest.raises(UnsafePathError, match=f"owned by uid {NOBODY}.*created it first"):
        _snapshot_steps(cfg, [1], job="78")


def test_a_missing_durable_root_is_made_private(tmp_path):
    durable = tmp_path / "run" / "ckpt"
    cfg = _cfg(tmp_path, local_every=0, durable_root=str(durable), durable_every=1)
    _snapshot_steps(cfg, [1])
    assert stat.S_IMODE(os.stat(durable).st_mode) == 0o700
    assert _restore(cfg).step == 1
