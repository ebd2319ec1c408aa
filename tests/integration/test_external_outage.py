"""A model hub down at start-up, on the real mini-cluster: waited out, never blamed.

The workers run a small wrapper that, for its first attempts, prints what huggingface_hub
prints when huggingface.co refuses connections and exits 1 before any step (the
classifier reads it as ``external_service``); later attempts exec the real example. With
a backoff of 1 s doubling to 4 s: three start-up failures restart in place after 1, 2 and
4 s (beyond max_no_progress, 3, which used to stop such a run), the run completes, and no
node is blamed. A hub that never comes back stops the run once the outage budget (6 s)
is spent, with a verdict naming huggingface.co. Small settings: each run takes well under
a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_helpers import run_diagnostics

from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_gpt.py"
CLI = [sys.executable, "-m", "slurm_robust.cli.main"]
NODES = 2

HUB_DOWN = '''\
"""The first FAIL attempts fail as huggingface_hub does with the Hub down; then exec."""
import os
import sys

fail = int(sys.argv[1])
if int(os.environ.get("SLURM_ROBUST_ATTEMPT", "0")) < fail:
    sys.stderr.write(
        "Traceback (most recent call last):\\n"
        '  File "/usr/lib/python3/site-packages/huggingface_hub/file_download.py", '
        "line 1722, in _get_metadata_or_catch_error\\n"
        "    metadata = get_hf_file_metadata(url=url, proxies=proxies, timeout=timeout)\\n"
        "requests.exceptions.ConnectionError: (MaxRetryError(\\"HTTPSConnectionPool("
        "host='huggingface.co', port=443): Max retries exceeded with url: "
        "/gpt2/resolve/main/config.json (Caused by NewConnectionError('<urllib3."
        "connection.HTTPSConnection object at 0x7f3a2c1b2d90>: Failed to establish a new "
        "connection: [Errno 111] Connection refused'))\\"), '(Request ID: 5e0f8a7c)')\\n")
    sys.stderr.flush()
    sys.exit(1)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
'''


class OutageRun:
    def __init__(self, cluster, name: str, fail_attempts: int, budget_s: float) -> None:
        self.env = cluster.env
        self.run_dir = str(cluster.cfg.shared_dir / f"test-{name}-{int(time.time() * 1000)}")
        script = Path(cluster.cfg.shared_dir) / f"hub_down-{int(time.time() * 1000)}.py"
        script.write_text(HUB_DOWN)
        script.chmod(0o644)
        argv = [*CLI, "submit", "--nodes", str(NODES), "--spares", "0", "--time", "10",
                "--folder", self.run_dir, "--json", "--outage-budget", str(budget_s),
                "--outage-backoff", "1", "--outage-backoff-max", "4", "--",
                sys.executable, str(script), str(fail_attempts), str(EXAMPLE),
                "--steps", "10", "--min-step-time", "0.1"]
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr
        self.job_id = json.loads(out.stdout)["job_id"]
        self.paths = RunPaths.of(self.run_dir)

    def events(self, kind: str) -> list[dict]:
        return [e for e in read_records(self.paths.events).records if e["event"] == kind]

    def wait_end(self, timeout: float = 90.0) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            ends = self.events("run_end")
            if ends:
                return ends[-1]
            time.sleep(0.3)
        raise AssertionError(f"run did not end in {timeout} s; run dir {self.run_dir}\n"
                             + run_diagnostics(self.run_dir, self.job_id))

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job_id], env=self.env, timeout=30)


@pytest.fixture
def outage(minicluster):
    started: list[OutageRun] = []

    def submit(name: str, fail_attempts: int, budget_s: float) -> OutageRun:
        run = OutageRun(minicluster, name, fail_attempts, budget_s)
        started.append(run)
        return run

    yield submit
    for run in started:
        run.cancel()


def test_a_hub_down_at_start_up_is_waited_out_with_a_growing_backoff(outage):
    run = outage("hub-down", fail_attempts=3, budget_s=120)
    end = run.wait_end()
    assert end["status"] == "completed", (end, run.run_dir)
    # each in-place restart was cut short by the next failure: written together, in time
    incidents = sorted(run.events("incident"), key=lambda i: i["detected_at"])
    assert [i["class"] for i in incidents] == ["external_service"] * 3, incidents
    assert [i["rung"] for i in incidents] == ["in_place"] * 3
    waits = [i["evidence"]["outage"]["backoff_s"] for i in incidents]
    assert waits == [1.0, 2.0, 4.0]
    assert all("huggingface.co" in i["evidence"]["outage"]["service"] for i in incidents)
    # each restart came no earlier than its backoff after the failure was decided
    for before, after in zip(incidents, incidents[1:], strict=False):
        assert after["detected_at"] - before["localized_at"] >= \
            before["evidence"]["outage"]["backoff_s"]
    st = load_state(run.paths.state)
    assert st.blamed == [] and st.restarts == 0 and st.no_progress == 0
    assert (st.outage_failures, st.outage_since, st.outage_not_before) == (0, None, None)
    assert not run.paths.verdicts.exists() or not run.paths.verdicts.read_text().strip()


def test_a_hub_that_stays_down_stops_the_run_naming_it(outage):
    run = outage("hub-gone", fail_attempts=1000, budget_s=6)
    end = run.wait_end()
    assert end["status"] == "stopped", (end, run.run_dir)
    verdict = end["verdict"]
    assert verdict.startswith("external service unreachable for "), verdict
    assert "huggingface.co" in verdict and "no node is blamed" in verdict
    incidents = sorted(run.events("incident"), key=lambda i: i["detected_at"])
    assert len(incidents) >= 2 and incidents[-1]["rung"] == "stop"
    assert {i["class"] for i in incidents} == {"external_service"}
    st = load_state(run.paths.state)
    assert st.blamed == [] and st.restarts == 0
    assert not run.paths.verdicts.exists() or not run.paths.verdicts.read_text().strip()
