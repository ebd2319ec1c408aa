"""Checkpoint roots are shared by every user's jobs; each job's own directories are private."""

import stat

from slurm_robust.ckpt.config import ensure_dir


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_shared_levels_are_sticky_and_job_levels_private(tmp_path):
    shared = tmp_path / "local" / "node1"
    job_dir = shared / "123" / "rank0"
    ensure_dir(job_dir, shared)
    assert _mode(tmp_path / "local") == 0o1777 and _mode(shared) == 0o1777
    assert _mode(shared / "123") == 0o700 and _mode(job_dir) == 0o700


def test_existing_directories_are_left_alone(tmp_path):
    shared = tmp_path / "shm"
    shared.mkdir(mode=0o755)
    ensure_dir(shared / "9" / "node1" / "rank1", shared)
    assert _mode(shared) == 0o755
    assert _mode(shared / "9" / "node1" / "rank1") == 0o700
