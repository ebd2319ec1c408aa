"""``slurm-robust launch`` inside the user's own sbatch script: the same agents and
controller as ``submit``, in the current allocation.

The batch script runs ``slurm-robust launch --spares 1 -- python train.py``; this writes
``<run_dir>/config.json`` and starts one agent per node with ``srun`` (``--no-kill``
and ``--kill-on-bad-exit=0``, so a lost node does not end the step). The run directory
defaults to ``runs/job-<SLURM_JOB_ID>`` under the submit directory: stable across Slurm
requeues, which re-run the batch script, so the attempt counter and the snapshots are
found again. For the requeue rung the script needs ``#SBATCH --requeue``.

srun is started here directly (argv list, no shell): it is the job's long-running step,
not a query, so it has no timeout; every other Slurm call goes through slurm_robust.slurm.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.paths import COMMENT_PREFIX, RunPaths, site_config_path
from slurm_robust.records import write_json_atomic
from slurm_robust.run_dir_trust import ensure_run_dir
from slurm_robust.slurm import Slurm, SlurmCommandError


def allocation_nodes(env: dict[str, str] | None = None) -> tuple[str, int]:
    """(job id, number of nodes) of the allocation this runs in; UsageError outside one."""
    e = os.environ if env is None else env
    job = e.get("SLURM_JOB_ID")
    nodes = e.get("SLURM_JOB_NUM_NODES") or e.get("SLURM_NNODES")
    if not job or not nodes:
        raise UsageError("`slurm-robust launch` runs inside a Slurm allocation (an sbatch "
                         "script or salloc); use `slurm-robust submit` from a login node")
    return job, int(nodes)


def default_run_dir(job_id: str, env: dict[str, str] | None = None) -> str:
    e = os.environ if env is None else env
    base = Path(e.get("SLURM_SUBMIT_DIR") or os.getcwd())
    return str(base / "runs" / f"job-{job_id}")


def srun_argv(cfg: RunConfig, config_path: Path) -> list[str]:
    # A requeue into a reserve shortfall may have shrunk the job to fewer spares
    # (control/shortfall.py): the agents run on the nodes the allocation has.
    alloc = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES")
    nodes = min(cfg.total_nodes, int(alloc)) if alloc and alloc.isdigit() else cfg.total_nodes
    return ["srun", f"--nodes={nodes}", f"--ntasks={nodes}",
            "--ntasks-per-node=1", "--no-kill", "--kill-on-bad-exit=0", "--unbuffered",
            sys.executable, "-m", "slurm_robust.launcher.node.agent", str(config_path)]


def launch(cfg: RunConfig, job_id: str) -> int:
    """Write the config, tag the job with its run directory, run the agents; srun's code."""
    paths = RunPaths.of(cfg.run_dir)
    # A pre-existing directory (the requeued batch script's, or one someone else made at
    # the predictable runs/job-<id>) is used only when it is ours and no one else can
    # write it: its versions and state decide what the workers run (run_dir_trust.py).
    ensure_run_dir(paths.root)
    if not cfg.site_config:
        cfg = dataclasses.replace(cfg, site_config=site_config_path())
    write_json_atomic(paths.config, cfg.to_dict(), mode=0o600)
    _tag_job(job_id, cfg.run_dir)
    return subprocess.call(srun_argv(cfg, paths.config))


def _tag_job(job_id: str, run_dir: str) -> None:
    # The comment lets `inject --job` and `status JOBID` find the run; best effort.
    try:
        Slurm().update_job(job_id, Comment=f"{COMMENT_PREFIX}{run_dir}")
    except SlurmCommandError:
        pass
