"""Live metrics end to end: a real Prometheus scrapes a robust run and the reserve exporter.

A 3+1 robust run on the mini-cluster loses one worker to SIGKILL (`slurm-robust inject
kill-worker`). The mini-cluster's Prometheus (`cluster up --prometheus`) finds the run's
controller through the file-SD target it wrote, and the exporter through its static
target; the assertions are PromQL queries through Prometheus's HTTP API.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from cluster_helpers import wait_until
from test_launcher_faults import NODES, Run

from slurm_robust_rehearsal.cluster import prometheus as prom
from slurm_robust_rehearsal.cluster.manager import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAIN = ["--steps", "80", "--min-step-time", "0.2"]


def query(promql: str) -> list[dict]:
    """An instant query; the result vector ([] when nothing matches yet)."""
    q = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(prom.url(f"/api/v1/query?{q}"), timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture
def prometheus(minicluster):
    MiniCluster(minicluster.cfg).up(prometheus=True)
    return minicluster


def test_prometheus_scrapes_a_run_with_one_fault_and_the_reserve(prometheus):
    run = Run(prometheus, "metrics", 1, train_args=TRAIN)
    try:
        run.wait_step(10)
        where = json.loads((run.paths.root / "metrics.json").read_text())
        assert where["host"] != "0.0.0.0" and where["port"] > 0
        sel = f'job_id="{run.job_id}"'
        # The run is a scrape target (found through its file-SD target file).
        wait_until("Prometheus to scrape the run", lambda: query(
            f'slurm_robust_run_steps_total{{{sel}}} > 0'), timeout_s=60)
        run.inject("kill-worker", "--rank", str(NODES - 1))
        # last_over_time: the target is withdrawn (series go stale) when the run ends.
        incidents = wait_until("the incident in Prometheus", lambda: query(
            f"last_over_time(slurm_robust_run_incidents_total{{{sel}}}[10m]) > 0"),
            timeout_s=90)
        assert len(incidents) == 1, incidents
        labels = incidents[0]["metric"]
        assert (labels["class"], labels["category"], labels["rung"]) == \
            ("worker_signal", "explicit", "in_place")
        assert float(incidents[0]["value"][1]) == 1.0
        assert labels["run_id"] == where["run_id"]
        recovered = wait_until("the recovery in Prometheus", lambda: query(
            f"last_over_time(slurm_robust_run_recover_seconds_count{{{sel}}}[10m]) > 0"),
            timeout_s=90)
        assert float(recovered[0]["value"][1]) == 1.0
        ettr = query(f'last_over_time(slurm_robust_run_ettr_ratio{{{sel},'
                     f'window="cumulative"}}[10m])')
        assert len(ettr) == 1 and 0.0 < float(ettr[0]["value"][1]) <= 1.0, ettr
        end = run.wait_end()
        assert end["status"] == "completed"
    finally:
        run.cancel()
    # The reserve exporter: the standby partition's size as Slurm reports it.
    standby = len(prometheus.slurm.partition_nodes("standby"))
    members = wait_until("the reserve exporter", lambda: query(
        'slurm_robust_reserve_members{partition="standby"}'), timeout_s=30)
    assert float(members[0]["value"][1]) == standby > 0
    assert query('slurm_robust_reserve_up{partition="standby"}')[0]["value"][1] == "1"
    # The run withdrew its target at the end.
    wait_until("the run's target to be withdrawn", lambda: not list(
        prom.targets_dir(prometheus.cfg).glob(f"{run.job_id}-*.json")), timeout_s=30)
