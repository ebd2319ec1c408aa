"""The user's side of a hot update: check, snapshot, ask the controller.

``request_update`` refuses (UsageError, one line, nothing changed) a run that is not
running, a path that is not a directory, an unknown revision, and a second update while
one is made or still pending. It makes the version (versions.py), appends ``requested``
to the change log and drops ``versions/request.json``, which the controller polls
(control/hot_update.py). The run directory is the job owner's, so a file in it is the
same trust boundary as the controller's authenticated channel.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.launcher import versions as vs
from slurm_robust.launcher.control.failover import ControllerRecord
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.run_dir_trust import check_run_dir, read_trusted_json

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
DEFAULT_DEADLINE_S = 24 * 3600.0


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``24h``, ``2d`` -> seconds."""
    m = _DURATION.match(text.strip())
    if not m:
        raise UsageError(f"--deadline {text!r}: use a number with s, m, h or d (e.g. 24h)")
    return float(m.group(1)) * _UNIT[m.group(2)]


def slurm_job_running(job_id: str) -> bool:
    """Whether Slurm says the job runs (through the access layer)."""
    from slurm_robust.slurm import Slurm

    job = Slurm().job(job_id)
    return job is not None and str(job.state).upper().startswith("RUNNING")


def check_running(run_dir: str, job_running: Callable[[str], bool] = slurm_job_running
                  ) -> ControllerRecord:
    """The controller's address record of a live run; UsageError otherwise."""
    paths = RunPaths.of(run_dir)
    if not paths.config.exists():
        raise UsageError(f"{run_dir} is not a robust run directory (no config.json)")
    state = load_state(paths.state)
    if state.finished:
        raise UsageError(f"run {run_dir} is not running (it ended: {state.finished})")
    try:
        info = read_trusted_json(paths.controller)
    except (OSError, ValueError) as exc:
        raise UsageError(f"run {run_dir} is not running (no controller yet)") from exc
    if not isinstance(info, dict):
        raise UsageError(f"run {run_dir}: {paths.controller} is not a JSON object")
    job_id = str(info.get("key", "")).split(".")[0]
    if not job_id or not job_running(job_id):
        raise UsageError(f"run {run_dir} is not running (job {job_id or '?'} is not "
                         "RUNNING in Slurm)")
    return dict(info)


def request_update(run_dir: str, *, code: str | None = None, git: str | None = None,
                   args: Sequence[str] | None = None, env: Sequence[str] = (),
                   mode: vs.ApplyMode = vs.ApplyMode.NOW, deadline_s: float | None = None,
                   rollback_steps: int = 10, message: str = "",
                   job_running: Callable[[str], bool] = slurm_job_running,
                   # open-ended: the change-log line, whose fields vary by event
                   ) -> dict[str, Any]:
    """Make and request a version (or a rollback); returns the change-log line."""
    if mode is vs.ApplyMode.ROLLBACK:
        if code is not None or git is not None or args is not None or env:
            raise UsageError("--rollback takes no --code/--git/--args/--env")
    elif (code is None) == (git is None):
        raise UsageError("give exactly one of --code DIR or --git REV (or --rollback)")
    if code is not None and not Path(code).is_dir():
        raise UsageError(f"--code {code}: not a directory")
    if rollback_steps < 0:
        raise UsageError(f"--rollback-steps {rollback_steps}: use >= 0")
    env_delta = vs.parse_env(env)
    owner = os.stat(run_dir).st_uid
    if owner != os.geteuid():
        # The versions made here are code the job's user runs: they must be that
        # user's files (the controller refuses anyone else's), made by that user.
        raise UsageError(f"run {run_dir} belongs to uid {owner}: run `slurm-robust update` "
                         "as that user (e.g. `runuser -u USER -- slurm-robust update ...`)")
    check_run_dir(run_dir)
    check_running(run_dir, job_running)
    vs.ensure_versions_dir(run_dir)
    with vs.UpdateLock(run_dir):
        if vs.request_path(run_dir).exists():
            raise UsageError(f"an update is already pending for {run_dir} (the controller "
                             "has not taken it yet); wait and retry")
        current = vs.read_current(run_dir)
        now = time.time()
        if mode is vs.ApplyMode.ROLLBACK:
            if not current["previous"]:
                raise UsageError(f"run {run_dir} runs its first version; nothing to roll "
                                 "back to")
            req = vs.UpdateRequest(version=None, mode=mode, requested_at=now,
                                   who=vs.who_am_i(), message=message)
            rec = vs.append_change(run_dir, vs.ChangeEvent.REQUESTED,
                                   {"mode": mode.value, "version": None,
                                    "from_version": current["version"],
                                    "who": req.who, "message": message}, now)
            vs.put_request(run_dir, req)
            return rec
        cfg = read_trusted_json(RunPaths.of(run_dir).config)
        base = vs.load_version(run_dir, current["version"], cfg["command"], cfg.get("env"))
        number = max([0, *vs.version_numbers(run_dir)]) + 1
        ver = vs.make_version(run_dir, base, code=code, git=git, args=args, env=env_delta,
                              message=message, number=number)
        if mode is vs.ApplyMode.AT_NEXT_RESTART and deadline_s is None:
            deadline_s = DEFAULT_DEADLINE_S
        req = vs.UpdateRequest(version=number, mode=mode, requested_at=now,
                               deadline_s=deadline_s, rollback_steps=rollback_steps,
                               who=ver.who, message=message)
        rec = vs.append_change(run_dir, vs.ChangeEvent.REQUESTED, {
            "mode": mode.value, "version": number, "from_version": current["version"],
            "kind": ver.kind, "source": ver.source, "rev": ver.rev, "digest": ver.digest,
            "command": ver.command, "args": ver.args, "env_delta": env_delta,
            "deadline_s": deadline_s, "rollback_steps": rollback_steps,
            "who": ver.who, "message": message}, now)
        vs.put_request(run_dir, req)
        return rec
