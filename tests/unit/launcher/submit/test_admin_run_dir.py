"""Admin tools that find a run directory from a job's Slurm comment (`status JOBID`,
`inject --job`, `update JOBID`) verify that the job's user owns it before reading or
writing there, and write as that user's files without following links."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.paths import COMMENT_PREFIX
from slurm_robust.launcher.submit import status as status_mod
from slurm_robust.launcher.submit.update import request_update
from slurm_robust.records import write_json_atomic
from slurm_robust.run_dir_trust import (
    UntrustedRunDirError,
    ensure_private_subdir,
    write_json_as_owner,
)
from slurm_robust.secure_fs import UnsafePathError
from slurm_robust_rehearsal.inject import job as inject_job

OTHER = 4242
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="files of another uid need root (chown)")


@dataclass
class FakeJob:
    user: str
    comment: str


class FakeSlurm:
    def __init__(self, job: FakeJob | None) -> None:
        self._job = job

    def job(self, job_id: str) -> FakeJob | None:
        return self._job


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def test_a_job_comment_naming_our_directory_resolves(tmp_path):
    run = status_mod.job_run("7", slurm=FakeSlurm(FakeJob(_me(), f"{COMMENT_PREFIX}{tmp_path}")))
    assert run.run_dir == str(tmp_path) and run.owner == os.geteuid()


@needs_root
def test_a_job_comment_naming_someone_elses_directory_is_refused(tmp_path):
    # The job's user is uid 4242; the comment names a directory of root's (/etc-like).
    with pytest.raises(UntrustedRunDirError, match="not by the run's user \\(uid 4242\\)"):
        status_mod.job_run("7", slurm=FakeSlurm(FakeJob(str(OTHER),
                                                        f"{COMMENT_PREFIX}{tmp_path}")))


def test_a_job_comment_naming_a_directory_others_can_write_is_refused(tmp_path):
    os.chmod(tmp_path, 0o777)
    with pytest.raises(UntrustedRunDirError, match="writable by group or others"):
        status_mod.job_run("7", slurm=FakeSlurm(FakeJob(_me(), f"{COMMENT_PREFIX}{tmp_path}")))


def test_a_job_without_a_robust_comment_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no run directory in its comment"):
        status_mod.job_run("7", slurm=FakeSlurm(FakeJob(_me(), "")))
    with pytest.raises(UsageError, match="not a running robust job"):
        status_mod.job_run("7", slurm=FakeSlurm(None))


@needs_root
def test_inject_refuses_a_run_dir_its_job_user_does_not_own(tmp_path, monkeypatch):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "n1.json").write_text(json.dumps({"workers": {"0": 1}}))
    monkeypatch.setattr(status_mod, "Slurm", lambda: FakeSlurm(
        FakeJob(str(OTHER), f"{COMMENT_PREFIX}{tmp_path}")))
    killed: list[int] = []
    monkeypatch.setattr(inject_job.os, "kill", lambda pid, sig: killed.append(pid))
    with pytest.raises(UntrustedRunDirError):
        inject_job.inject("kill-worker", "7")
    assert killed == [] and not (tmp_path / "inject").exists()


@needs_root
def test_files_root_writes_for_a_user_are_that_users(tmp_path):
    os.chown(tmp_path, OTHER, -1)
    d = ensure_private_subdir(tmp_path / "nan", OTHER)
    write_json_atomic(d / "poison.json", {"x": 1}, mode=0o600, owner=OTHER)
    for p in (d, d / "poison.json"):
        st = os.lstat(p)
        assert st.st_uid == OTHER and not stat.S_IMODE(st.st_mode) & 0o077
    assert [p.name for p in d.iterdir()] == ["poison.json"]  # no temp file left


def test_write_json_atomic_never_follows_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "out.json").symlink_to(target)
    write_json_atomic(tmp_path / "out.json", {"a": 1}, mode=0o600)
    assert target.read_text() == "keep" and not (tmp_path / "out.json").is_symlink()


@needs_root
def test_update_as_someone_other_than_the_run_owner_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    os.chown(tmp_path, OTHER, -1)
    code = tmp_path.parent / f"{tmp_path.name}-code"
    code.mkdir()
    with pytest.raises(UsageError, match="belongs to uid 4242: run `slurm-robust update` as"):
        request_update(str(tmp_path), code=str(code), job_running=lambda j: True)
    assert not (tmp_path / "versions").exists()


def test_status_of_a_directory_reads_its_state(tmp_path):
    Path(tmp_path / "events.jsonl").write_text("")
    assert status_mod.run_status(str(tmp_path))["status"] == "pending"


@needs_root
def test_changes_as_root_reads_a_users_run_as_that_users(tmp_path, capsys):
    import argparse

    from slurm_robust.cli import changes
    from slurm_robust.launcher import versions as vs

    vdir = tmp_path / "versions"
    vdir.mkdir(mode=0o700)
    vs.write_current(tmp_path, 3, [0, 2])
    for p in (tmp_path, vdir, vdir / "current.json"):
        os.chown(p, OTHER, -1)
    assert changes.run(argparse.Namespace(target=str(tmp_path), json=True)) == 0
    assert json.loads(capsys.readouterr().out)["current_version"] == 3
    os.chown(vdir / "current.json", 0, -1)  # one file of someone else's in that run
    with pytest.raises(UntrustedRunDirError):
        changes.run(argparse.Namespace(target=str(tmp_path), json=True))


@pytest.fixture
def shared_base():
    """A root-owned 0755 directory outside pytest's private tmp tree, so that OTHER can
    reach what is made for it inside."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sr-admin-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_root_writes_into_a_users_run_dir_as_that_user(shared_base):
    run = shared_base / "run"
    run.mkdir(mode=0o700)
    os.chown(run, OTHER, OTHER)
    out = write_json_as_owner(run / "inject", "fault.json", {"x": 1}, OTHER)
    for p in (run / "inject", out):
        st = os.lstat(p)
        assert st.st_uid == OTHER and not stat.S_IMODE(st.st_mode) & 0o077
    assert json.loads(out.read_text()) == {"x": 1}


@needs_root
def test_a_run_dir_swapped_for_a_link_into_roots_tree_gets_nothing(shared_base):
    # The user replaces the verified run directory by a link to a directory of root's
    # (say /etc) before the tool writes: root must not create anything there for them.
    roots = shared_base / "roots"
    roots.mkdir(mode=0o755)
    run = shared_base / "run"
    run.symlink_to(roots)
    os.lchown(run, OTHER, OTHER)
    with pytest.raises(UnsafePathError, match="as uid 4242: PermissionError"):
        write_json_as_owner(run / "inject", "fault.json", {"x": 1}, OTHER)
    assert list(roots.iterdir()) == []
