"""The run directory as a trust boundary (slurm_robust/run_dir_trust.py) and
every reader routed through it: a directory or file another user made, could write, or
linked is refused before its content is used."""

from __future__ import annotations

import json
import os
import pickle
import stat
from pathlib import Path

import pytest

from slurm_robust.launcher import versions as vs
from slurm_robust.launcher.control.state import RunState, load_state, save_state
from slurm_robust.launcher.control.succession import read_controller
from slurm_robust.launcher.node import fnworker
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit import launch as launch_mod
from slurm_robust.run_dir_trust import (
    UntrustedRunDirError,
    check_run_dir,
    ensure_run_dir,
    read_trusted_bytes,
    read_trusted_json,
    run_dir_owner,
)

#: Another user's uid for planted files (chown needs root; the CI runs the tests as root).
OTHER = 4242
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="planting a file of another uid needs root (chown)")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _plant(path: Path, text: str, uid: int = OTHER, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, uid, -1)
    return path


# ------------------------------------------------------------------ the directory
def test_a_new_run_dir_is_private(tmp_path):
    root = ensure_run_dir(tmp_path / "shared" / "runs" / "job-7")
    assert _mode(root) == 0o700
    assert os.stat(root).st_uid == os.geteuid()


def test_an_existing_run_dir_of_ours_is_kept_as_it_is(tmp_path):
    root = tmp_path / "r"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    (root / "keep").write_text("x")
    ensure_run_dir(root)
    assert _mode(root) == 0o755 and (root / "keep").read_text() == "x"


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o1777, 0o757])
def test_a_run_dir_others_can_write_is_refused_and_left_alone(tmp_path, mode):
    root = tmp_path / "r"
    root.mkdir()
    os.chmod(root, mode)
    (root / "state.json").write_text("{}")
    with pytest.raises(UntrustedRunDirError, match="writable by group or others.*chmod go-w"):
        ensure_run_dir(root)
    assert _mode(root) == mode and (root / "state.json").exists()  # nothing changed


@needs_root
def test_a_run_dir_pre_created_by_another_user_is_refused(tmp_path):
    root = tmp_path / "runs" / "job-42"
    root.mkdir(parents=True, mode=0o700)
    os.chown(root, OTHER, OTHER)
    with pytest.raises(UntrustedRunDirError, match="owned by uid 4242.*another run directory"):
        ensure_run_dir(root)
    assert os.stat(root).st_uid == OTHER  # not taken over, not deleted


@needs_root
def test_a_symlinked_run_dir_of_another_user_is_refused(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(ours)
    check_run_dir(link)  # our own link to our own directory: fine
    os.lchown(link, OTHER, -1)
    with pytest.raises(UntrustedRunDirError, match="symlink owned by uid 4242"):
        check_run_dir(link)


def test_a_versions_dir_others_can_write_is_refused(tmp_path):
    (tmp_path / "versions").mkdir()
    os.chmod(tmp_path / "versions", 0o777)
    with pytest.raises(UntrustedRunDirError, match="versions"):
        check_run_dir(tmp_path)


# ------------------------------------------------------------------ files
def test_read_trusted_json_reads_our_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"x": 1}')
    assert read_trusted_json(path) == {"x": 1}


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_trusted_bytes(tmp_path / "nope")


def test_a_symlink_is_refused_even_to_our_own_file(tmp_path):
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "a.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(UntrustedRunDirError, match="symlink"):
        read_trusted_json(tmp_path / "a.json")


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "a.json")
    with pytest.raises(UntrustedRunDirError, match="not a regular file"):
        read_trusted_json(tmp_path / "a.json")


def test_a_file_others_can_write_is_refused(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("{}")
    os.chmod(path, 0o666)
    with pytest.raises(UntrustedRunDirError, match="writable by group or others"):
        read_trusted_json(path)


@needs_root
def test_a_planted_file_owned_by_another_uid_is_refused(tmp_path):
    path = _plant(tmp_path / "a.json", "{}")
    with pytest.raises(UntrustedRunDirError, match="owned by uid 4242"):
        read_trusted_json(path)
    assert read_trusted_json(path, owner=OTHER) == {}  # an admin tool naming that owner


def test_a_file_over_its_bound_is_refused(tmp_path):
    path = tmp_path / "a"
    path.write_bytes(b"x" * 100)
    with pytest.raises(UntrustedRunDirError, match="over the 10-byte limit"):
        read_trusted_bytes(path, max_bytes=10)


def test_root_trusts_a_named_directory_as_its_owners(tmp_path):
    assert run_dir_owner(tmp_path, 1234) == 1234
    assert run_dir_owner(tmp_path) == (os.stat(tmp_path).st_uid if os.geteuid() == 0
                                       else os.geteuid())


# ------------------------------------------------------------------ the readers
@needs_root
def test_a_planted_current_version_is_refused_not_run(tmp_path):
    vdir = tmp_path / "versions"
    vdir.mkdir(mode=0o700)
    _plant(vdir / "v1.json", json.dumps(vs.CodeVersion(
        1, "code", None, None, None, None, ["sh", "-c", "touch /tmp/pwned"]).to_dict()))
    _plant(vdir / "current.json", json.dumps({"version": 1, "previous": [0]}))
    with pytest.raises(UntrustedRunDirError, match="current.json.*uid 4242"):
        vs.read_current(tmp_path)
    with pytest.raises(UntrustedRunDirError, match="v1.json.*uid 4242"):
        vs.load_version(tmp_path, 1)


@needs_root
def test_a_planted_request_is_refused(tmp_path):
    vdir = tmp_path / "versions"
    vdir.mkdir(mode=0o700)
    _plant(vdir / "request.json", json.dumps(vs.UpdateRequest(
        1, vs.ApplyMode.NOW, 0.0).to_dict()))
    got = vs.take_request(tmp_path)
    assert isinstance(got, str) and "uid 4242" in got


def test_versions_under_a_dir_others_can_write_are_refused(tmp_path):
    vdir = tmp_path / "versions"
    vdir.mkdir()
    vs.write_current(tmp_path, 0, [])
    os.chmod(vdir, 0o777)
    with pytest.raises(UntrustedRunDirError, match="versions"):
        vs.read_current(tmp_path)


@needs_root
def test_a_planted_state_is_refused(tmp_path):
    _plant(tmp_path / "state.json", json.dumps(RunState().to_dict()))
    with pytest.raises(UntrustedRunDirError, match="state.json"):
        load_state(tmp_path / "state.json")


def test_state_is_written_private(tmp_path):
    save_state(tmp_path / "state.json", RunState())
    assert _mode(tmp_path / "state.json") == 0o600
    assert load_state(tmp_path / "state.json").attempt == -1


@needs_root
def test_a_planted_controller_file_is_no_controller(tmp_path):
    paths = RunPaths.of(tmp_path)
    _plant(paths.controller, json.dumps({"key": "7.0.0", "host": "10.0.0.9", "port": 1}))
    assert read_controller(paths, "7.0.0") is None
    os.chown(paths.controller, os.geteuid(), -1)
    assert read_controller(paths, "7.0.0") is not None


@needs_root
def test_planted_agent_files_are_skipped(tmp_path):
    paths = RunPaths.of(tmp_path)
    _plant(paths.agent_file("n1"), json.dumps({"node": "n1", "workers": {"0": 1}}))
    paths.agent_file("n2").write_text(json.dumps({"node": "n2", "workers": {}}))
    assert set(paths.read_agents()) == {"n2"}


@needs_root
def test_a_planted_function_pickle_is_not_unpickled(tmp_path):
    marker = tmp_path / "ran"
    _plant(tmp_path / "function.pkl", "", mode=0o644)
    (tmp_path / "function.pkl").write_bytes(pickle.dumps((Path.touch, (marker,), {})))
    os.chown(tmp_path / "function.pkl", OTHER, -1)
    with pytest.raises(UntrustedRunDirError):
        fnworker.main([str(tmp_path / "function.pkl")])
    assert not marker.exists()


def test_our_function_pickle_runs(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    (tmp_path / "function.pkl").write_bytes(pickle.dumps((Path.touch, (marker,), {})))
    monkeypatch.setenv("RANK", "0")
    assert fnworker.main([str(tmp_path / "function.pkl")]) == 0
    assert marker.exists() and _mode(tmp_path / "result.pkl") == 0o600


@needs_root
def test_launch_refuses_a_pre_created_run_dir_and_runs_nothing(tmp_path, monkeypatch):
    from slurm_robust.launcher.config import RunConfig

    root = tmp_path / "runs" / "job-9"
    root.mkdir(parents=True, mode=0o755)
    os.chown(root, OTHER, OTHER)
    ran: list[list[str]] = []
    monkeypatch.setattr(launch_mod.subprocess, "call", lambda argv: ran.append(argv) or 0)
    monkeypatch.setattr(launch_mod, "_tag_job", lambda *a: None)
    cfg = RunConfig(command=("true",), run_dir=str(root), nodes=1)
    with pytest.raises(UntrustedRunDirError, match="owned by uid 4242"):
        launch_mod.launch(cfg, "9")
    assert ran == [] and not (root / "config.json").exists()


def test_launch_makes_the_run_dir_and_config_private(tmp_path, monkeypatch):
    from slurm_robust.launcher.config import RunConfig

    root = tmp_path / "runs" / "job-9"
    monkeypatch.setattr(launch_mod.subprocess, "call", lambda argv: 0)
    monkeypatch.setattr(launch_mod, "_tag_job", lambda *a: None)
    launch_mod.launch(RunConfig(command=("true",), run_dir=str(root), nodes=1), "9")
    assert _mode(root) == 0o700 and _mode(root / "config.json") == 0o600


def test_a_sticky_world_writable_durable_root_is_refused(tmp_path):
    # <run_dir>/ckpt used to be made 1777: its squatters could rename our copies.
    (tmp_path / "ckpt").mkdir()
    os.chmod(tmp_path / "ckpt", 0o1777)
    with pytest.raises(UntrustedRunDirError, match="ckpt.*writable by group or others"):
        check_run_dir(tmp_path)
