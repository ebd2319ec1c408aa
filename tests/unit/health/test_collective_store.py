"""The deep collective check's rendezvous cannot be hijacked through /tmp.

It used to pick a name in the shared temp directory, unlink it, and hand the name to a
FileStore: another user who recreated the name in between (a watcher on /tmp wins that
race) hung the collective, and the root check then drained a good node. The store now
lives in a private directory of its own. Here the "other user" is a wrapper that plants
a file at every name removed from, or created in, the shared directory; a real second
user could not write inside our 0700 directory, and neither does the wrapper.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from slurm_robust.health import collective


def _run_bounded(fn, timeout_s: float):
    """fn() in a forked process, as the check runs the worker under a timeout: its
    result, or None when it did not end in time. The parent's patches carry over."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)

    def target() -> None:
        os.setsid()  # its own group: the ranks it forks are killed with it
        child.send(fn())

    proc = ctx.Process(target=target)
    proc.start()
    got = parent.recv() if parent.poll(timeout_s) else None
    proc.join(5)
    if got is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.join()
    return got


@pytest.fixture
def shared(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


def test_a_file_planted_at_the_store_name_does_not_affect_the_collective(shared,
                                                                          monkeypatch):
    real_unlink, real_mkdtemp = os.unlink, tempfile.mkdtemp
    planted: list[str] = []
    modes: list[int] = []

    def unlink_then_plant(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if Path(path).parent == shared:  # the race won: junk at the name just freed
            Path(path).write_bytes(b"\x00junk from another user\xff" * 64)
            planted.append(str(path))

    def mkdtemp_watched(*args, **kwargs):
        made = real_mkdtemp(*args, **kwargs)
        modes.append(stat.S_IMODE(os.stat(made).st_mode))
        return made

    monkeypatch.setattr(collective.os, "unlink", unlink_then_plant)
    monkeypatch.setattr(collective.tempfile, "mkdtemp", mkdtemp_watched)
    # Junk at every name in the shared directory a guesser would try.
    for name in ("slurm_robust_collective_", "store", "slurm_robust_collective_store"):
        (shared / name).write_bytes(b"junk")
    def check() -> tuple[dict, list[str], list[int]]:  # runs in the forked process
        out = collective.run(world=2, backend="gloo", numel=64, timeout_s=20.0)
        return out, planted, modes

    got = _run_bounded(check, 90.0)
    assert got is not None, "the collective hung (a hijacked store)"
    out, planted_there, modes_there = got
    assert out["ok"], out
    assert planted_there == [] and modes_there == [0o700]
    # Nothing of ours is left behind, and the planted files are untouched.
    assert sorted(p.name for p in shared.iterdir()) == sorted(
        ["slurm_robust_collective_", "store", "slurm_robust_collective_store"])
