"""Submission through submitit, and a submitit-style executor with the robust options.

``submit_run(cfg, slurm)`` is what ``slurm-robust submit`` calls: a submitit
``SlurmExecutor`` job of N + k nodes, one task per node, each running
:func:`slurm_robust.launcher.node.agent.run_agent`. sbatch gets ``--requeue`` (our own
``scontrol requeue`` and Slurm's node-failure requeue re-run the batch script, and
submitit re-executes the pickled function) and ``--no-kill`` (the allocation survives
a node loss; the spare takes over). srun gets ``--no-kill`` and
``--kill-on-bad-exit=0`` for the same reason. The job comment carries the run
directory (``slurm_robust:run_dir=...``) so ``inject`` and ``status`` find it by job id.

:class:`RobustExecutor` mirrors submitit's executor for Python users::

    ex = RobustExecutor(folder="/shared/runs/r1", spares=1, hang_floor_s=60)
    ex.update_parameters(nodes=4, gpus_per_node=8, partition="train", time=600)
    job = ex.submit(train_fn, cfg)          # train_fn runs on every rank
    job.job_id, job.state; job.result()     # rank 0's return value
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.errors import LauncherError, RunStopped
from slurm_robust.launcher.node.agent import run_agent
from slurm_robust.launcher.paths import COMMENT_PREFIX, RunPaths, site_config_path
from slurm_robust.launcher.submit.lemons import exclude_for_submit
from slurm_robust.launcher.worker_signals import WARNING_SIGNAL
from slurm_robust.records import (
    EVENT_SCHEMA,
    read_records,
    write_bytes_atomic,
    write_json_atomic,
)
from slurm_robust.run_dir_trust import (
    ensure_private_subdir,
    ensure_run_dir,
    read_trusted_bytes,
)


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm side of a submission (submitit SlurmExecutor parameters)."""

    partition: str | None = None
    time_min: int = 60
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    job_name: str = "slurm-robust"
    account: str | None = None
    exclude: str | None = None
    #: Submit onto lemons too (health/lemons.py); by default they join ``exclude``.
    allow_lemons: bool = False
    # open-ended: the user's own sbatch options (additional_parameters), passed through
    extra: dict[str, Any] = field(default_factory=dict)


class SubmititParams(TypedDict, total=False):
    """What the robust job asks of submitit's SlurmExecutor (its parameter names)."""

    nodes: int
    ntasks_per_node: int
    time: int
    job_name: str
    comment: str
    additional_parameters: Mapping[str, object]
    srun_args: list[str]
    signal_delay_s: int
    stderr_to_stdout: bool
    partition: str
    gpus_per_node: int
    cpus_per_task: int
    account: str
    exclude: str
    mem: str


def submit_run(cfg: RunConfig, slurm: SlurmOptions) -> Any:
    """Submit the agents of ``cfg`` through submitit; returns the submitit job."""
    import submitit  # function-level: heavy, and only the submitting side needs it

    # Slurm's warning before the time limit (--signal=28@S): the job requeues itself.
    warn_s = max(1, round(cfg.warn_before_s))
    if not warn_s < slurm.time_min * 60:
        # Slurm would warn at once, and every allocation would requeue before a step.
        raise UsageError(f"the time-limit warning ({warn_s} s before the "
                         f"end, --warn-before) must come within the time limit "
                         f"({slurm.time_min * 60} s)")
    paths = RunPaths.of(cfg.run_dir)
    # Private (0700), or an existing directory of ours no one else can write: submitit's
    # pickles and our config in it are what every allocation of the job runs.
    ensure_run_dir(paths.root)
    ensure_private_subdir(paths.submitit)
    if not cfg.site_config:
        cfg = dataclasses.replace(cfg, site_config=site_config_path())
    write_json_atomic(paths.config, cfg.to_dict(), mode=0o600)
    ex = submitit.SlurmExecutor(folder=str(paths.submitit), max_num_timeout=3)
    exclude = exclude_for_submit(slurm.exclude, slurm.allow_lemons, cfg.site_config,
                                 warn=lambda text: print(f"slurm-robust: {text}",
                                                         file=sys.stderr))
    params: SubmititParams = {
        "nodes": cfg.total_nodes, "ntasks_per_node": 1, "time": slurm.time_min,
        "job_name": slurm.job_name, "comment": f"{COMMENT_PREFIX}{cfg.run_dir}",
        # Slurm's warning before the time limit: WARNING_SIGNAL by number (sbatch takes
        # no name for it), replacing submitit's USR2 line (worker_signals.py says why).
        "additional_parameters": {"requeue": True, "no-kill": True,
                                  "signal": f"{int(WARNING_SIGNAL)}@{warn_s}",
                                  **slurm.extra},
        "srun_args": ["--no-kill", "--kill-on-bad-exit=0"],
        "signal_delay_s": warn_s, "stderr_to_stdout": True,
    }
    if slurm.partition is not None:
        params["partition"] = slurm.partition
    if slurm.gpus_per_node is not None:
        params["gpus_per_node"] = slurm.gpus_per_node
    if slurm.cpus_per_task is not None:
        params["cpus_per_task"] = slurm.cpus_per_task
    if slurm.account is not None:
        params["account"] = slurm.account
    if exclude is not None:
        params["exclude"] = exclude
    if slurm.mem_gb is not None:
        params["mem"] = f"{int(slurm.mem_gb * 1024)}M"
    ex.update_parameters(**params)
    try:
        return ex.submit(run_agent, cfg)
    except Exception as exc:  # submitit raises FailedSubmissionError with sbatch's words
        raise LauncherError(f"sbatch refused the robust job: {exc}") from exc


# --------------------------------------------------------------------- Python executor
_SLURM_KEYS = {"nodes", "partition", "time", "gpus_per_node", "cpus_per_task", "mem_gb",
               "job_name", "account", "exclude", "allow_lemons", "additional_parameters"}
_ROBUST_KEYS = {f.name for f in dataclasses.fields(RunConfig)} - {"command", "run_dir", "nodes"}


class RobustExecutor:
    """A submitit-style executor whose jobs run under the robust launcher.

    Parameters are submitit's (``nodes``, ``partition``, ``time`` in minutes,
    ``gpus_per_node``, ``cpus_per_task``, ``mem_gb``, ``job_name``, ``account``,
    ``exclude``, ``allow_lemons``, ``additional_parameters``) plus every RunConfig option
    (``spares``, ``hang_floor_s``, ``max_restarts``, ``local_every``, ``durable_every``, ...).
    Unknown keys raise UsageError listing the valid ones.
    """

    def __init__(self, folder: str | os.PathLike[str], **params: Any) -> None:
        self.folder = Path(folder).absolute()
        # open-ended: the caller's submitit-style and RunConfig parameters, checked by name
        self._params: dict[str, Any] = {"nodes": 1, "time": 60}
        self.update_parameters(**params)

    def update_parameters(self, **params: Any) -> None:
        unknown = sorted(set(params) - _SLURM_KEYS - _ROBUST_KEYS)
        if unknown:
            raise UsageError(f"unknown parameter(s) {unknown}; valid: "
                             f"{sorted(_SLURM_KEYS | _ROBUST_KEYS)}")
        self._params.update(params)

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> RobustJob:
        """Run ``fn(*args, **kwargs)`` on every rank; returns the job."""
        import cloudpickle  # function-level: shipped with submitit, only the submitter needs it

        run_dir = self.folder / time.strftime("%Y%m%d-%H%M%S") if \
            (self.folder / "events.jsonl").exists() else self.folder
        ensure_run_dir(run_dir)
        fn_path = run_dir / "function.pkl"
        _pickle_user_module_by_value(fn, cloudpickle)
        write_bytes_atomic(fn_path, [cloudpickle.dumps((fn, args, kwargs))], mode=0o600)
        p = self._params
        robust = {k: v for k, v in p.items() if k in _ROBUST_KEYS}
        cfg = RunConfig(command=(sys.executable, "-m", "slurm_robust.launcher.node.fnworker",
                                 str(fn_path)), run_dir=str(run_dir), nodes=p["nodes"],
                        **robust)
        slurm = SlurmOptions(partition=p.get("partition"), time_min=int(p["time"]),
                             gpus_per_node=p.get("gpus_per_node"),
                             cpus_per_task=p.get("cpus_per_task"), mem_gb=p.get("mem_gb"),
                             job_name=p.get("job_name", "slurm-robust"),
                             account=p.get("account"), exclude=p.get("exclude"),
                             allow_lemons=bool(p.get("allow_lemons", False)),
                             extra=dict(p.get("additional_parameters") or {}))
        return RobustJob(submit_run(cfg, slurm), str(run_dir))


def _pickle_user_module_by_value(fn: Any, cloudpickle: Any) -> None:
    """Ship the code of a user's own module (a script, a test, a notebook) inside the
    pickle; functions of installed packages are pickled by reference as usual."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    if module is None or module.__name__ == "__main__" or module.__name__.startswith(
            "slurm_robust") or "-packages" in origin:
        return
    cloudpickle.register_pickle_by_value(module)


class RobustJob:
    """A submitted robust run: ``job_id``, ``state``, ``result()``, ``events()``."""

    def __init__(self, job: Any, run_dir: str) -> None:
        self._job = job
        self.run_dir = run_dir

    @property
    def job_id(self) -> str:
        return str(self._job.job_id)

    @property
    def state(self) -> str:
        return str(self._job.state)

    def done(self) -> bool:
        return bool(self._job.done())

    # open-ended: events.jsonl records, whose keys vary by event (docs/SCHEMAS.md)
    def events(self) -> list[dict[str, Any]]:
        return read_records(RunPaths.of(self.run_dir).events, EVENT_SCHEMA).records

    def result(self, poll_s: float = 2.0) -> Any:
        """Wait for the run; rank 0's return value, or RunStopped with the verdict."""
        while not self._job.done():
            time.sleep(poll_s)
        ends = [e for e in self.events() if e.get("event") == "run_end"]
        if ends and ends[-1].get("status") == "stopped":
            raise RunStopped(ends[-1].get("verdict") or "stopped", self.run_dir)
        result = Path(self.run_dir) / "result.pkl"
        try:
            # Ours, not a link, not writable by others: unpickling runs code.
            data = read_trusted_bytes(result)
        except FileNotFoundError:
            raise LauncherError(f"job {self.job_id} ended ({self.state}) without a result; "
                                f"see {self.run_dir}/events.jsonl and {self.run_dir}/logs"
                                ) from None
        return pickle.loads(data)
