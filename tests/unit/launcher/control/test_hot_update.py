"""Hot update and rollback without a cluster: versions, the user's request,
and the recovery owner switching versions (fake clock, scripted reports, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher import versions as vs
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.cadence import HURRY_POLL_S
from slurm_robust.launcher.control.recovery import Recovery, SlurmSide
from slurm_robust.launcher.enums import Phase, Rung
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.submit.update import parse_duration, request_update
from slurm_robust.launcher.worker_signals import DRAIN_S
from tests.unit.launcher.control.test_recovery_owner import Clock, Harness, Member, SlurmRecorder


def code_dir(root: Path, marker: str) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text(f"print({marker!r})\n")
    (root / "lib").mkdir()
    (root / "lib" / "util.py").write_text("X = 1\n")
    return root


def run_dir_for(tmp_path: Path, command: list[str]) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (run / "config.json").write_text(json.dumps({"command": command, "env": {"A": "1"}}))
    (run / "controller.json").write_text(json.dumps({"key": "42.0.0"}))
    return run


def always(_job: str) -> bool:
    return True


# ---------------------------------------------------------------------- versions
def test_a_version_is_an_immutable_private_snapshot(tmp_path):
    v1 = code_dir(tmp_path / "v1", "one")
    (v1 / "__pycache__").mkdir()
    (v1 / "__pycache__" / "x.pyc").write_bytes(b"junk")
    run = run_dir_for(tmp_path, [sys.executable, str(v1 / "train.py"), "--steps", "5"])
    v2 = code_dir(tmp_path / "v2", "two")
    rec = request_update(str(run), code=str(v2), args=["--steps", "9"], env=["B=2"],
                         message="fix", job_running=always)
    ver = vs.load_version(run, rec["version"])
    snap = Path(ver.path)
    assert ver.number == 1 and ver.kind == "code" and ver.source == str(v2)
    assert ver.command == [sys.executable, str(snap / "train.py"), "--steps", "9"]
    assert ver.env == {"A": "1", "B": "2"} and ver.message == "fix" and ver.who
    assert (snap / "lib" / "util.py").read_text() == "X = 1\n"
    assert not (snap / "__pycache__").exists()
    assert ver.digest == vs.tree_digest(snap) and len(ver.digest) == 64
    assert os.stat(run / "versions").st_mode & 0o777 == 0o700
    assert os.stat(snap / "train.py").st_mode & 0o777 == 0o400
    if os.getuid() != 0:  # root writes through any mode bits
        with pytest.raises(PermissionError):
            (snap / "train.py").write_text("changed")
    (v2 / "train.py").write_text("print('edited after')\n")  # the source changes later
    assert (snap / "train.py").read_text() == "print('two')\n"
    req = json.loads(vs.request_path(run).read_text())
    assert req["version"] == 1 and req["mode"] == "now" and req["v"] == 1
    changes = vs.read_changes(run)
    assert [c["event"] for c in changes] == ["requested"]
    assert changes[0]["schema"] == vs.CHANGE_SCHEMA and changes[0]["env_delta"] == {"B": "2"}


def test_bad_input_is_refused_and_changes_nothing(tmp_path):
    v1 = code_dir(tmp_path / "v1", "one")
    run = run_dir_for(tmp_path, [sys.executable, str(v1 / "train.py")])
    with pytest.raises(UsageError, match="not a directory"):
        request_update(str(run), code=str(v1 / "train.py"), job_running=always)
    with pytest.raises(UsageError, match="is not running"):
        request_update(str(run), code=str(v1), job_running=lambda j: False)
    with pytest.raises(UsageError, match="KEY=VALUE"):
        request_update(str(run), code=str(v1), env=["1X=2"], job_running=always)
    with pytest.raises(UsageError, match="has no train.py"):
        request_update(str(run), code=str(v1 / "lib"), job_running=always)
    with pytest.raises(UsageError, match="contains the run directory"):
        request_update(str(run), code=str(tmp_path), job_running=always)
    assert not vs.version_numbers(run) and not vs.read_changes(run)
    request_update(str(run), code=str(v1), job_running=always)
    with pytest.raises(UsageError, match="already pending"):
        request_update(str(run), code=str(v1), job_running=always)
    with vs.UpdateLock(run):
        vs.request_path(run).unlink()
        with pytest.raises(UsageError, match="another update"):
            request_update(str(run), code=str(v1), job_running=always)
    assert vs.version_numbers(run) == [1] and len(vs.read_changes(run)) == 1
    assert [p.name for p in (run / "versions").iterdir() if p.name.startswith(".v")] == []
    (run / "state.json").write_text(json.dumps({"finished": "completed"}))
    with pytest.raises(UsageError, match="ended: completed"):
        request_update(str(run), code=str(v1), job_running=always)


def test_git_revision_snapshot_and_unknown_revision(tmp_path):
    repo = code_dir(tmp_path / "repo", "old")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.strip()
    (repo / "train.py").write_text("print('new')\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    run = run_dir_for(tmp_path, [sys.executable, str(repo / "train.py")])
    with pytest.raises(UsageError, match="unknown revision"):
        request_update(str(run), git="nope-rev", job_running=always)
    assert not vs.version_numbers(run)
    rec = request_update(str(run), git="HEAD~1", job_running=always)
    ver = vs.load_version(run, rec["version"])
    assert ver.kind == "git" and ver.rev == first
    assert (Path(ver.path) / "train.py").read_text() == "print('old')\n"
    assert ver.command[1] == str(Path(ver.path) / "train.py")


def test_durations():
    assert parse_duration("24h") == 86400 and parse_duration("90") == 90
    assert parse_duration("1.5m") == 90
    with pytest.raises(UsageError):
        parse_duration("soon")


# ---------------------------------------------------------------------- controller
class CodeHarness(Harness):
    """The recovery owner of test_recovery_owner.py, on a real script command."""

    def __init__(self, tmp_path: Path, run_dir: Path | None = None, **cfg_kw: Any) -> None:
        self.v0 = tmp_path / "v0"
        if not self.v0.exists():
            code_dir(self.v0, "zero")
        kw: dict[str, Any] = {"nodes": 2, "spares": 1, "heartbeat_timeout_s": 2.0,
                              "hang_floor_s": 5.0, "startup_timeout_s": 5.0,
                              "fail_slow": False}
        kw.update(cfg_kw)
        run = run_dir or tmp_path / "run"
        run.mkdir(mode=0o700, exist_ok=True)
        self.cfg = RunConfig(command=(sys.executable, str(self.v0 / "train.py")),
                             run_dir=str(run), **kw)
        (run / "config.json").write_text(json.dumps(self.cfg.to_dict()))
        (run / "controller.json").write_text(json.dumps({"key": "42.0.0"}))
        self.clock = Clock(time.time())  # requests carry the wall clock
        self.slurm = SlurmRecorder()
        self.members = {i: Member(i, f"n{i + 1}") for i in range(self.cfg.total_nodes)}
        ident = Identity(index=0, node="n1", job_id="42", step_key="42.0.0",
                         restart_count=0)
        self.rec = Recovery(self.cfg, ident, self.members, expected=self.cfg.total_nodes,
                            slurm=SlurmSide(requeue=self.slurm.requeue,
                                            drain=self.slurm.drain,
                                            verdict=self.slurm.verdict),
                            clock=self.clock)
        self.step = 0

    def update(self, name: str, **kw: Any) -> int:
        src = Path(self.cfg.run_dir).parent / name
        if not src.exists():
            code_dir(src, name)
        return int(request_update(self.cfg.run_dir, code=str(src), job_running=always,
                                  **kw)["version"])

    def command(self, index: int = 0) -> list[str] | None:
        plan = self.rec.plan_for(index)
        assert plan is not None
        return plan.command

    def changes(self) -> list[str]:
        return [c["event"] for c in vs.read_changes(self.cfg.run_dir)]


def test_now_restarts_in_place_at_the_next_step_boundary(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    assert h.command() is None  # version 0: the config's command
    h.update("v1", message="more logging")
    h.tick(0.3)
    assert h.gen() == 1  # taken, but no step has finished since the request
    # agents report quickly until the boundary: the controller sees it, and they the
    # new plan, within HURRY_POLL_S instead of a heartbeat
    assert h.rec.plan_for(0).poll_s == HURRY_POLL_S
    h.steps(1)
    h.tick(0.0)
    assert h.gen() == 2 and h.rec.phase is Phase.RUNNING
    assert h.rec.plan_for(0).poll_s is None
    assert h.rec.state.restarts == 0  # a change is not a failure: the budget is untouched
    cmd = h.command()
    assert cmd is not None and cmd[1].endswith("versions/v1/code/train.py")
    assert h.rec.plan_for(0).code_version == 1 and h.rec.plan_for(0).code_change
    assert h.rec.plan_for(2).command is None  # the parked spare has no workers
    # the old generation ends by choice: its workers drain (the boundary step's
    # snapshot must be whole, or the new one redoes it)
    assert h.rec.plan_for(0).drain_s == DRAIN_S
    h.restored(4)
    h.steps(1)
    assert h.changes() == ["requested", "applied", "resumed"]
    resumed = vs.read_changes(h.cfg.run_dir)[-1]
    assert resumed["restored_step"] == 4 and resumed["applied_step"] == 4
    assert resumed["steps_redone"] == 0 and resumed["downtime_s"] > 0
    (inc,) = h.incidents()  # the change, as ByteRobust's manual incident class
    assert inc["class"] == "code_data_change" and inc["category"] == "manual"
    assert inc["rung"] == "in_place" and inc["steps_lost"] == 0 and inc["nodes"] == []
    assert inc["recovered_at"] - inc["fault_time"] == pytest.approx(resumed["downtime_s"],
                                                                    abs=1e-3)
    assert inc["evidence"]["message"] == "more logging" and inc["evidence"]["version"] == 1


def test_at_next_restart_goes_with_an_in_place_restart(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    h.update("v1", mode=vs.ApplyMode.AT_NEXT_RESTART)
    h.tick(0.3)
    h.steps(3)
    assert h.gen() == 1 and h.changes() == ["requested", "staged"]
    h.fail(h.members[1], "worker_signal")
    h.settle()
    assert h.gen() == 2 and h.command()[1].endswith("v1/code/train.py")
    applied = vs.read_changes(h.cfg.run_dir)[-1]
    assert applied["event"] == "applied" and applied["how"] == "restart"
    assert h.rec.plan_for(0).drain_s is None  # a failure's stop does not drain


def test_at_next_restart_is_forced_at_its_deadline(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    h.update("v1", mode=vs.ApplyMode.AT_NEXT_RESTART, deadline_s=5.0)
    h.tick(0.3)
    h.steps(2)
    assert h.gen() == 1
    h.clock.advance(5.0)
    h.tick(0.0)  # due at the deadline; applied after the next finished step
    h.steps(1)
    h.tick(0.0)
    assert h.gen() == 2 and h.command()[1].endswith("v1/code/train.py")
    assert vs.read_changes(h.cfg.run_dir)[-1]["how"] == "deadline"


def test_a_failing_new_version_rolls_back_and_a_requeue_keeps_the_version(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    h.update("v1")
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    h.restored(4)
    h.fail(h.members[0], "code_data_change", signature="code_data_change:TypeError@x:1")
    h.settle()
    assert h.gen() == 3 and h.rec.phase is Phase.RUNNING
    assert h.command()[1] == str(h.v0 / "train.py")  # back on version 0
    rolled = vs.read_changes(h.cfg.run_dir)[-1]
    assert rolled["event"] == "rolled_back" and rolled["from_version"] == 1
    assert "code_data_change" in rolled["reason"]
    assert vs.read_current(h.cfg.run_dir)["version"] == 0
    h.restored(4)
    h.steps(1)
    assert len(h.incidents()) == 1  # the failure's incident records the rollback
    inc = h.incidents()[-1]
    assert inc["rung"] == Rung.IN_PLACE and "rolled" not in inc["evidence"]["decision"]
    assert "failed with code_data_change" in inc["evidence"]["rollback"]

    # a new version, then a requeue: the next allocation's owner runs the same version
    h.update("v2")
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    assert h.command()[1].endswith("v2/code/train.py")
    again = CodeHarness(tmp_path, run_dir=Path(h.cfg.run_dir))
    assert again.rec.hot.version.number == 2
    again.tick()
    assert again.command()[1].endswith("v2/code/train.py")


def test_a_repeated_user_error_after_an_update_rolls_back_instead_of_stopping(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    sig = "user_exception:TypeError@train.py:3"
    h.fail(h.members[0], "user_exception", signature=sig)  # seen once before the change
    h.settle()
    h.restored(3)
    h.steps(1)
    h.update("v1")
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    h.restored(5)
    h.fail(h.members[0], "user_exception", signature=sig)
    h.settle()
    assert h.rec.phase is Phase.RUNNING and h.command()[1] == str(h.v0 / "train.py")


def test_manual_rollback(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    with pytest.raises(UsageError, match="nothing to roll back"):
        request_update(h.cfg.run_dir, mode=vs.ApplyMode.ROLLBACK, job_running=always)
    h.update("v1")
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    h.restored(4)
    h.steps(20)  # past the rollback window: a manual one still works
    request_update(h.cfg.run_dir, mode=vs.ApplyMode.ROLLBACK, message="worse loss",
                   job_running=always)
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    assert h.command()[1] == str(h.v0 / "train.py")
    last = vs.read_changes(h.cfg.run_dir)[-1]
    assert last["event"] == "rolled_back" and "worse loss" in last["reason"]


# ---------------------------------------------------------------------- CLI
def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurm_robust.cli.main", *argv],
                          capture_output=True, text=True, timeout=60)


def test_cli_refuses_in_one_line_and_lists_changes(tmp_path):
    v1 = code_dir(tmp_path / "v1", "one")
    run = run_dir_for(tmp_path, [sys.executable, str(v1 / "train.py")])
    out = cli("update", str(run), "--code", str(tmp_path / "missing"), "--now")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "not a directory" in out.stderr
    out = cli("update", str(run), "--code", str(v1), "--deadline", "1h")
    assert out.returncode == 2 and "--deadline goes with --at-next-restart" in out.stderr
    assert not (run / "versions").exists() and not vs.read_changes(run)
    request_update(str(run), code=str(v1), args=["--lr", "1"], message="why",
                   job_running=always)
    out = cli("changes", str(run), "--json")
    assert out.returncode == 0, out.stderr
    log = json.loads(out.stdout)
    assert log["current_version"] == 0 and log["changes"][0]["args"] == ["--lr", "1"]
    out = cli("changes", str(run))
    assert "requested  v1" in out.stdout and "message=why" in out.stdout


def test_the_report_counts_a_change_as_a_manual_incident_with_its_downtime(tmp_path):
    from slurm_robust.analysis.pipeline import analyse, load_inputs

    h = CodeHarness(tmp_path)
    h.start()
    h.update("v1")
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    h.restored(4)
    h.steps(3)
    h.rec.finish("completed", None)
    head = analyse(load_inputs([h.cfg.run_dir])).headline()
    assert head["by_category"]["manual"] == 1 and head["by_class"] == {"code_data_change": 1}
    assert head["unread"]["total"] == 0 and head["steps_redone"] == 0
    assert head["mean_time_to_recover_s"] > 0


def test_a_change_is_recorded_for_the_classifier_only_within_its_window(tmp_path):
    h = CodeHarness(tmp_path)
    h.start()
    h.update("v1", rollback_steps=3)
    h.tick(0.3)
    h.steps(1)
    h.tick(0.0)
    assert h.rec.plan_for(0).code_change
    h.restored(4)
    h.steps(3)  # the window closes
    h.fail(h.members[1], "worker_signal")
    h.settle()
    plan = h.rec.plan_for(0)
    assert plan.code_version == 1 and not plan.code_change
    assert plan.command[1].endswith("v1/code/train.py")
