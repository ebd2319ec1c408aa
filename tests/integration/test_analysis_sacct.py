"""The analysis against the real mini-cluster: sacct, sacctmgr events and sinfo -R."""

from __future__ import annotations

import json
import time

import pytest
from cluster_helpers import shared_out_dir as _out_dir
from cluster_helpers import wait_until as _wait_until

from slurm_robust.analysis.fetch import TIME_ENV, fetch_slurm_records
from slurm_robust.analysis.frames import LoadIssues
from slurm_robust.cli.main import main
from slurm_robust.slurm import Slurm
from slurm_robust_rehearsal.synth.runs import Fault, synth_run, write_run_dir

pytestmark = pytest.mark.integration


def wait_until(what, probe, timeout_s=90.0, interval_s=0.3):
    return _wait_until(what, probe, timeout_s, interval_s)


def test_fetch_reads_failed_and_requeued_jobs_and_node_events(minicluster):
    s = minicluster.slurm
    client = Slurm({**minicluster.cfg.env(), **TIME_ENV})
    out = _out_dir(minicluster, "analysis")
    since = time.time() - 2
    failed = s.sbatch(["-N", "1", "-p", "train", "-o", str(out / "%j.out")],
                      script="#!/bin/sh\nexit 3\n")
    requeued = s.sbatch(["-N", "1", "-p", "train", "--requeue", "-o", str(out / "%j.out")],
                        script='#!/bin/sh\n[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] || sleep 300\n')
    try:
        wait_until("job running", lambda: s.job(requeued).running)
        s.requeue(requeued, start_now=True)
        wait_until("jobs done", lambda: all((j := s.job(i)) is None or j.finished
                                            for i in (failed, requeued)))
    finally:
        s.cancel(requeued)

    def fetched():
        issues = LoadIssues()
        recs = fetch_slurm_records(since=since, job_ids=[failed, requeued], issues=issues,
                                   client=client)
        done = recs.jobs[recs.jobs["end"].notna()]
        return (len(done) >= 3 and not done["state"].isin(["RUNNING", "PENDING"]).any()
                and (recs, issues))

    recs, issues = wait_until("sacct records", fetched, 60)
    assert issues.total == 0, issues.as_dict()
    jobs = recs.jobs.set_index("job_id")
    fail_row = jobs.loc[[failed]].iloc[-1]
    assert str(fail_row["state"]) == "FAILED" and int(fail_row["exit_code"]) == 3
    assert fail_row["start"] >= since - 5 and fail_row["nnodes"] == 1
    states = [str(x) for x in jobs.loc[[requeued], "state"]]
    assert states[0] == "REQUEUED" and len(states) == 2
    from slurm_robust.analysis.fleet import fleet_view
    view = fleet_view(recs.jobs)
    assert view.requeued_jobs == 1
    assert set(view.by_cause["cause"]) >= {"FAILED (exit 3)", "REQUEUED"}


def test_drain_shows_up_as_a_node_event(minicluster):
    s = minicluster.slurm
    client = Slurm({**minicluster.cfg.env(), **TIME_ENV})
    node = "node4"
    before = s.node(node)
    if before.drained or not before.usable:
        pytest.skip(f"{node} is not idle and in service; not touching another test's node")
    since = time.time() - 1
    s.drain(node, "slurm_robust: analysis_test: actual 1, expected 0")
    try:
        recs = wait_until("open drain", lambda: (r := fetch_slurm_records(
            since=since, job_ids=["0"], client=client)).node_events.pipe(
                lambda ev: ((ev["node"] == node) & (ev["kind"] == "drain")).any()) and r, 30)
        ev = recs.node_events[recs.node_events["node"] == node].iloc[-1]
        assert "analysis_test" in ev["reason"] and ev["start"] >= since - 5
    finally:
        s.resume(node)


def test_report_cli_with_live_sacct(minicluster, tmp_path, capsys, monkeypatch):
    for key, value in minicluster.cfg.env().items():
        monkeypatch.setenv(key, value)
    run = synth_run(steps=10, faults=[Fault(4, "cuda_error", "spare", nodes=("node2",))],
                    start=time.time() - 3600)
    d = write_run_dir(tmp_path / "run", run)
    since = time.time() - 7 * 86400
    assert main(["report", str(d), "--sacct", "--since", str(since), "-o",
                 str(tmp_path / "out"), "--json"]) == 0
    head = json.loads(capsys.readouterr().out)
    assert head["incidents"] == 1
    assert head["fleet"]["jobs"] >= 1 and head["unread"]["total"] == 0
    assert "Fleet (sacct)" in (tmp_path / "out" / "report.md").read_text()
