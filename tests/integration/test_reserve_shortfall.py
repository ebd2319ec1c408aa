"""A requeue the partition and the reserve cannot serve, on the mini-cluster.

The reserve (partition ``standby``) is emptied by draining its nodes for the test. Without
the shortfall check, a requeued job that excludes its blamed node then asks for more
nodes than ``train`` has left and pends until an admin returns one, with nothing of the
run alive to say so. Now the launcher counts before it requeues and applies
``--on-shortfall``: ``shrink`` (default) requeues on fewer nodes when the training world
still fits, giving up the parked spare; ``stop`` ends the run with a verdict. Either way
the run ends (resumed or stopped) within minutes, never pending.
"""

from __future__ import annotations

import time

import pytest
from cluster_helpers import spare_path_victim, wait_until
from test_launcher_faults import NODES, baseline_sha, runs  # noqa: F401  (fixtures)

from slurm_robust.launcher.control.state import load_state

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DRAIN_REASON = "slurm_robust test: reserve emptied for the shortfall test"


@pytest.fixture
def drained(minicluster):
    """Drain nodes for the test (``drain(name)``); resumed at the end if we drained them."""
    slurm, ours = minicluster.slurm, []

    def drain(name: str) -> None:
        if not slurm.node(name).drained:
            slurm.drain(name, DRAIN_REASON)
            ours.append(name)

    yield drain
    for name in ours:
        if slurm.node(name).reason == DRAIN_REASON:
            slurm.resume(name)


def empty_reserve(minicluster, drain) -> None:
    for name in minicluster.cfg.spare_nodes:
        drain(name)


def test_shortfall_shrinks_the_requeue_to_the_nodes_left(runs, baseline_sha,  # noqa: F811
                                                         drained, minicluster):
    # NODES + 1 spare fill `train`; the lost batch node (agent 0's: losing it ends the
    # job in Slurm's eyes, so the requeue rung even with the spare parked) leaves NODES
    # there and the reserve has none: shrink requeues on NODES nodes (no spare) instead
    # of pending.
    assert len(minicluster.cfg.train_nodes) == NODES + 1, "sized for a 4-node train"
    empty_reserve(minicluster, drained)
    run = runs("shortfall-shrink", spares=1)
    run.wait_step(10)
    victim = load_state(run.paths.state).members["0"]
    run.inject("kill-node", "--node", victim)
    runs.killed.append(victim)
    end = run.wait_end(timeout=180)
    inc = run.events("incident")[-1]
    short = inc["evidence"]["shortfall"]
    assert (short["needs"], short["has"], short["choice"], short["nodes"]) == \
        (NODES + 1, NODES, "shrink", NODES), short
    assert inc["rung"] == "requeue" and inc["recovered_at"] is not None, inc
    state = load_state(run.paths.state)
    assert state.requeues == 1 and victim not in state.slots
    starts = run.events("attempt_start")
    assert {e["attempt"] for e in starts} == {0, 1}
    assert len(starts[-1]["nodes"]) == NODES, starts[-1]
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha, end


def _one_node_short(runs, drained, minicluster, name: str):  # noqa: F811
    """A run on NODES nodes (no spare) at step 5, with the reserve and the train node it
    does not use drained: losing any of its nodes leaves NODES - 1."""
    empty_reserve(minicluster, drained)
    run = runs(name, spares=0)
    run.wait_step(5)
    state = load_state(run.paths.state)
    for node in minicluster.cfg.train_nodes:
        if node not in state.slots:
            drained(node)
    return run, state


def _lose_and_stop(run, runs, victim: str) -> tuple[float, dict]:  # noqa: F811
    """Kill ``victim``; the run must stop on the shortfall. Returns (injected, run_end)."""
    injected = time.time()
    run.inject("kill-node", "--node", victim)
    runs.killed.append(victim)
    end = run.wait_end(timeout=120)
    assert end["status"] == "stopped", end
    assert f"reserve shortfall (needs {NODES}, has {NODES - 1})" in end["verdict"], end
    return injected, end


def test_shortfall_that_the_world_cannot_fit_stops_with_a_verdict(runs, drained,  # noqa: F811
                                                                  minicluster):
    # No spare; the train node the job does not use is drained too, so the requeue off
    # a lost node would leave NODES - 1 nodes: the run stops, the job ends. The lost node
    # is off the batch node (its loss is the next test's) and the controller's.
    run, state = _one_node_short(runs, drained, minicluster, "shortfall-stop")
    injected, _ = _lose_and_stop(run, runs, spare_path_victim(state, run.controller_node()))
    inc = run.events("incident")[-1]
    assert inc["rung"] == "stop" and inc["evidence"]["shortfall"]["choice"] == "stop", inc
    assert load_state(run.paths.state).requeues == 0
    # The Slurm job ends instead of pending: well within the 5 minutes.
    def job_ended() -> bool:
        job = minicluster.slurm.job(run.job_id)
        assert job is None or job.state != "PENDING", job  # never requeued
        return job is None or job.finished

    wait_until("the job to end", job_ended, 180)
    assert time.time() - injected < 300


def test_a_stop_after_losing_the_batch_node_ends_the_job(runs, drained,  # noqa: F811
                                                          minicluster):
    # As above, but the lost node is the batch node: Slurm would keep the job RUNNING on
    # the nodes left (its batch step cannot report from a dead node); the run cancels it.
    run, state = _one_node_short(runs, drained, minicluster, "shortfall-stop-batch")
    injected, _ = _lose_and_stop(run, runs, state.members["0"])

    def job_ended() -> bool:
        job = minicluster.slurm.job(run.job_id)
        return job is None or job.finished

    wait_until("the job to end", job_ended, 120)
    job = minicluster.slurm.job(run.job_id)
    assert job is None or job.state == "CANCELLED", job
    assert time.time() - injected < 240
