"""recover through slurmctld's own outage.

A node fault on a worker node with no spare makes the ladder requeue the job; slurmctld
is stopped right after the fault and started again 10 s later, so the requeue meets an
unreachable controller. The requeue must wait for it (in its own thread: the controller
keeps answering the agents), the run completes with the fault-free digest, and only the
faulty node is blamed.
"""

from __future__ import annotations

import threading
import time

import pytest
from test_launcher_faults import baseline_sha, runs  # noqa: F401

from slurm_robust.health import PENDING_PREFIX
from slurm_robust.launcher.control.state import load_state
from slurm_robust_rehearsal.cluster.manager import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPEAT = "slurm_robust: repeat offender: "


def test_requeue_through_a_slurmctld_outage(runs, baseline_sha, minicluster):  # noqa: F811
    run = runs("ctld-outage", spares=0)
    run.wait_step(10)
    ctl_node = run.controller_node()
    victim = next(n for n in minicluster.slurm.jobs([run.job_id])[0].nodes if n != ctl_node)
    mc = MiniCluster(minicluster.cfg)
    run.inject("kill-node", "--node", victim)
    runs.killed.append(victim)
    mc.stop_slurmctld()
    restart = threading.Timer(10.0, mc.start_slurmctld)
    restart.start()
    try:
        end = run.wait_end(timeout=400)
    finally:
        restart.join()
    assert end["status"] == "completed", run.tail()
    assert end["params_sha256"] == baseline_sha
    state = load_state(run.paths.state)
    assert state.blamed == [victim] and state.requeues == 1
    assert ctl_node not in state.blamed
    inc = [e for e in run.events("incident")]
    assert [i["nodes"] for i in inc] == [[victim]], inc
    time.sleep(1)
    drained = [n.name for n in minicluster.slurm.nodes() if n.drained]
    assert ctl_node not in drained
    # Slurm had marked the victim DOWN and taken it out of the job (--no-kill): the
    # verdict is still judged against the nodes the job was given (sacct) and drains it
    # pending a deep check, so ReturnToService cannot bring it back unchecked.
    dead = minicluster.slurm.node(victim)
    # (a repeat offender from earlier runs on this cluster says so instead: kept too)
    assert dead.drained and dead.reason.startswith((PENDING_PREFIX, REPEAT)), dead
    assert "node_lost" in dead.reason and len(dead.reason) <= 100
