"""EpilogSlurmctld's job-end path without Slurm: the fast path, refusals, env parsing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.records import read_records
from slurm_robust.reserve.handoff import handle_job_end, is_requeued, job_end_from_env
from slurm_robust.reserve.verdicts import (
    ensure_verdict_root,
    write_restart_request,
    write_verdict,
)
from slurm_robust.site_config import SiteConfig
from slurm_robust.slurm import Job, SlurmCommandError

ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": str(os.geteuid()),
       "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_PARTITION": "train",
       "SLURM_JOB_RESTART_COUNT": "1"}


def no_slurm():
    raise AssertionError("a job without applicable verdicts must not call Slurm")


def site_for(tmp_path: Path) -> SiteConfig:
    return SiteConfig(verdict_log=str(tmp_path / "log" / "verdicts.jsonl"))


def test_env_is_parsed_and_validated() -> None:
    end = job_end_from_env(ENV)
    assert end.nodes == ("node1", "node2") and end.restart_count == 1
    assert end.partition == "train" and end.uid == os.geteuid()
    with pytest.raises(UsageError):
        job_end_from_env({**ENV, "SLURM_JOB_USER": "../root"})
    with pytest.raises(UsageError):
        job_end_from_env({**ENV, "SLURM_JOB_ID": "42; rm -rf /"})


def test_job_without_verdicts_makes_no_slurm_call(tmp_path: Path) -> None:
    site = site_for(tmp_path)
    assert handle_job_end(job_end_from_env(ENV), site, no_slurm, no_slurm) is None
    assert not Path(site.verdict_log).exists()


class AccountingOnly:
    """Answers sacct only (what the job was given); any other Slurm call fails the test."""

    calls: list[list[str]] = []

    def sacct_raw(self, fields, args=()):
        self.calls.append(list(args))
        return "node[1-3]\nnode3\nNone assigned\n"


def test_verdicts_only_for_foreign_nodes_are_logged_and_change_nothing(tmp_path: Path) -> None:
    """node7 was never given to the job: sacct (asked once, on the miss) says so."""
    site = site_for(tmp_path)
    root = tmp_path / "log" / "verdicts"
    ensure_verdict_root(root)
    path = write_verdict(root, "alice", "42", "node1", "xid", "gpu_memory_error")
    path.write_text(path.read_text().replace('"node1"', '"node7"'))
    AccountingOnly.calls = []
    report = handle_job_end(job_end_from_env(ENV), site, AccountingOnly, no_slurm)
    assert AccountingOnly.calls == [["-j", "42", "--duplicates"]]
    assert report is not None and report.verdicts == 0 and report.refused == 1
    logged = read_records(site.verdict_log).records
    assert [(r["action"], r["node"]) for r in logged] == [("refused", "node7")]
    assert "not in job 42's allocation" in logged[0]["why"]
    assert json.loads((root / "alice" / "42.1.done").read_text())["node"] == "node7"


def test_verdicts_are_put_back_when_slurm_fails(tmp_path: Path) -> None:
    site = site_for(tmp_path)
    root = tmp_path / "log" / "verdicts"
    ensure_verdict_root(root)
    path = write_verdict(root, "alice", "42", "node1", "xid", "gpu_memory_error")

    def broken_slurm():
        raise SlurmCommandError(["squeue", "--json"], 1, "Could not establish a configuration")

    with pytest.raises(SlurmCommandError):
        handle_job_end(job_end_from_env(ENV), site, broken_slurm, no_slurm)
    assert path.exists() and not (root / "alice" / "42.1.done").exists()


def job(state: str, end_time: int) -> Job:
    return Job("42", "j", "alice", state, "", "train", (), 1, "", 1, True, 0, 0, end_time, 0,
               "", "")


def test_requeued_is_told_from_end_time_while_completing() -> None:
    now = 1_000.0
    assert is_requeued(job("COMPLETING", 6_090_908_112), now)  # EndTime=Unknown
    assert not is_requeued(job("COMPLETING", 990), now)  # ended for good
    assert is_requeued(job("PENDING", 0), now)
    assert not is_requeued(job("COMPLETED", 990), now) and not is_requeued(None, now)


class SqueueOnly:
    """Answers ``squeue`` for job 42 with ``state``; any other Slurm call fails the test."""

    state = "COMPLETING"
    calls = 0

    def job(self, job_id):
        assert str(job_id) == "42"
        SqueueOnly.calls += 1
        return job(self.state, 6_090_908_112 if self.state == "COMPLETING" else 0)


@pytest.mark.parametrize("state, requeued", [("COMPLETING", True), ("PENDING", True),
                                             ("COMPLETED", False)])
def test_a_restart_request_alone_asks_slurm_once_whether_to_start(tmp_path: Path, state,
                                                                  requeued) -> None:
    """A requeue that blamed no node (a time limit): no verdict, no drain, no spare; the
    report says whether the job was requeued, and the caller then starts it."""
    site = site_for(tmp_path)
    root = tmp_path / "log" / "verdicts"
    ensure_verdict_root(root)
    write_restart_request(root, "alice", "42", "time limit")
    SqueueOnly.state, SqueueOnly.calls = state, 0
    report = handle_job_end(job_end_from_env(ENV), site, SqueueOnly, no_slurm)
    assert SqueueOnly.calls == 1
    assert report is not None and report.requeued is requeued
    assert report.verdicts == 0 and report.refused == 0 and report.outcomes == []
    assert not Path(site.verdict_log).exists()  # nothing applied, nothing refused
    assert (root / "alice" / "42.1.done").exists()
