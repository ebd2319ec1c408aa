"""`slurm-robust inject` signals processes on the host it runs on. Run away from the
worker (a login node of a real cluster), it must say so, not "is the run past its start?"."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_robust.launcher.errors import InjectionError
from slurm_robust_rehearsal.inject.job import pick_worker


def _run_dir(tmp_path: Path, workers: dict[str, int]) -> str:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "node7.json").write_text(json.dumps({"workers": workers}))
    return str(tmp_path)


def test_workers_listed_but_not_here_names_the_host_and_the_way(tmp_path: Path) -> None:
    # This test's own pid is live but carries no Slurm job id: as a worker seen from a
    # host where the job's processes do not run.
    run_dir = _run_dir(tmp_path, {"3": os.getpid()})
    with pytest.raises(InjectionError) as err:
        pick_worker(run_dir, None, None, job_id="4242")
    text = str(err.value)
    assert "on this host" in text and "srun --overlap --jobid 4242 -w node7" in text, text


def test_no_worker_listed_still_asks_whether_the_run_started(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, {})
    with pytest.raises(InjectionError, match="is the run past its start"):
        pick_worker(run_dir, None, None, job_id="4242")


def test_a_rank_not_listed_is_not_blamed_on_the_host(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path, {"3": os.getpid()})
    with pytest.raises(InjectionError, match="is the run past its start"):
        pick_worker(run_dir, None, 5, job_id="4242")
