"""The NaN ladder on the real mini-cluster: a poisoned sample
(`inject nan --mode data`) returns on every replay, so after one replay the run stops
with a verdict naming the step and the data position (policy stop) or skips that batch
(policy skip); no node is blamed or drained either way. The skip run's final parameters
equal a fault-free standalone run that skips the same batch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_robust.launcher.control.state import load_state
from slurm_robust.slurm import Slurm
from tests.integration.cluster_helpers import spare_path_victim, standalone_digest
from tests.integration.test_launcher_faults import (  # noqa: F401
    CLI,
    EXAMPLE,
    NODES,
    STEPS,
    _return_node,
    runs,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def standalone_sha(*extra: str, world: int = NODES) -> str:
    return standalone_digest([sys.executable, str(EXAMPLE), "--steps", str(STEPS), *extra],
                             world)


def _data_nan(run) -> tuple[int, str, list[dict]]:
    run.wait_step(8)
    injected = run.inject("nan", "--mode", "data", "--rank", str(NODES - 1))
    end = run.wait_end()
    incidents = run.events("incident")
    return injected["poison_step"], injected["node"], [end, *incidents]


def _no_node_blamed(run, minicluster) -> None:
    assert not run.paths.verdicts.exists() or not run.paths.verdicts.read_text().strip()
    slurm: Slurm = minicluster.slurm
    for node in ("node1", "node2", "node3", "node4"):
        assert not slurm.node(node).drained, node


def test_data_nan_stops_after_one_replay_naming_step_and_position(runs, minicluster):  # noqa: F811
    run = runs("nan-data-stop")
    step, node, (end, *incidents) = _data_nan(run)
    assert end["status"] == "stopped", run.tail()
    assert f"step {step} (data position {step - 1})" in end["verdict"]
    assert f"{node} rank {NODES - 1}" in end["verdict"]
    assert [i["evidence"]["nan"]["resolution"] for i in incidents] == ["reattempt", "stop"]
    for inc in incidents:
        assert inc["nodes"] == [node] and inc["ranks"] == [NODES - 1]
    assert incidents[0]["restored_step"] == step - 1  # replayed from the last good step
    _no_node_blamed(run, minicluster)


def test_data_nan_skip_policy_matches_a_run_that_skips_the_batch(runs, minicluster):  # noqa: F811
    run = runs("nan-data-skip", extra=["--nan-policy", "skip"])
    step, _node, (end, *incidents) = _data_nan(run)
    assert end["status"] == "completed", run.tail()
    assert [i["evidence"]["nan"]["resolution"] for i in incidents] == ["reattempt", "skip"]
    _no_node_blamed(run, minicluster)
    assert end["params_sha256"] == standalone_sha("--skip-steps", str(step))
    assert end["params_sha256"] != standalone_sha()


def test_sdc_node_failing_the_bitwise_test_is_evicted(runs, minicluster):  # noqa: F811
    run = runs("sdc-bitwise")
    run.wait_step(8)
    # The eviction takes the in-job spare: a node that is neither the controller's nor
    # the batch node, as in every spare test.
    victim = spare_path_victim(load_state(run.paths.state), run.controller_node())
    run.inject("sdc", "--node", victim, "--probability", "0.25", "--bitwise")
    end = run.wait_end()
    assert end["status"] == "completed", run.tail()
    incidents = run.events("incident")
    seen = [(i["class"], i.get("rung"), i["nodes"], sorted(i["evidence"])) for i in incidents]
    assert incidents and all("nan" in i["evidence"] for i in incidents), (seen, run.tail())
    resolutions = [i["evidence"]["nan"]["resolution"] for i in incidents]
    # The replay after the first NaN runs the bitwise test; the node fails it.
    assert resolutions[-1] == "evict" and set(resolutions) <= {"reattempt", "evict"}
    evicted = incidents[-1]
    assert evicted["rung"] == "spare" and victim in evicted["nodes"]
    bw = evicted["evidence"]["nan"]["bitwise"]
    assert bw["differing_nodes"] == [victim] and bw["complete"]
    verdicts = run.paths.verdicts.read_text()
    assert victim in verdicts and "bitwise reference test" in verdicts
    assert end["params_sha256"] == standalone_sha()
    _return_node(minicluster, run, victim)  # the verdict drains it: back for the next test


def test_sdc_the_bitwise_test_misses_is_found_by_dual_phase_replay(runs, minicluster):  # noqa: F811
    """Four nodes of two ranks (DP 8, a 2 x 2 grid), no in-job spare: the corrupt node
    passes the bitwise test, so its NaN moves from replay to replay; after the rollback
    the rows, then the columns, replay the failing steps and cross at it. It is evicted
    (requeued onto the reserve) and the run ends with the fault-free parameters."""
    reset = _cli(minicluster, "reserve", "reset")
    assert reset.returncode == 0, reset.stderr
    fresh = _cli(minicluster, "reserve", "reconcile", "--json")  # deep-check the spares
    assert fresh.returncode == 0, fresh.stderr
    steps = ["--steps", "60", "--min-step-time", "0.2"]
    run = runs("sdc-replay", spares=0, train_args=steps,
               extra=["--nodes", "4", "--workers-per-node", "2"])
    run.wait_step(8)
    victim = spare_path_victim(load_state(run.paths.state), run.controller_node())
    run.inject("sdc", "--node", victim, "--probability", "0.5")
    end = run.wait_end(timeout=600)
    incidents = run.events("incident")
    seen = [(i["class"], i.get("rung"), i["nodes"],
             i["evidence"].get("nan", {}).get("resolution")) for i in incidents]
    assert end["status"] == "completed", (seen, run.tail())
    assert [r for *_, r in seen] == ["reattempt", "rollback", "replay"], seen
    located = incidents[-1]
    assert located["rung"] == "requeue" and victim in located["nodes"], seen
    rp = located["evidence"]["nan"]["replay"]
    assert rp["located"] == victim and rp["grid"] == [2, 2], rp
    assert sorted(rp["groups"]["horizontal"].values()) == ["nan", "passed"], rp
    assert sorted(rp["groups"]["vertical"].values()) == ["nan", "passed"], rp
    assert "dual-phase replay" in run.paths.verdicts.read_text()
    assert end["params_sha256"] == standalone_sha(*steps[:2], world=8)
    _return_node(minicluster, run, victim)


def _cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], env=cluster.env, capture_output=True, text=True,
                          timeout=300)
