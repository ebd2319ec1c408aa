"""The namespaced mini-cluster (``cluster up --netns``): real per-node addresses and
network faults, with the ladder fencing a partitioned node.

Runs only where network namespaces can be made (root, iproute2). The session's cluster is
switched to --netns for this module and back to the mode it had afterwards (with
``SLURM_ROBUST_TEST_NETNS=1`` the session starts in --netns and nothing is switched).
The partition rehearsal is a 3 + 1 run of examples/train_gpt.py: a worker node's link
is cut mid-run, the spare takes its slot, the link comes back, and the old node's agent
and workers stop by themselves without writing anything into the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from cluster_helpers import spare_path_victim, wait_until
from test_launcher_faults import CLI, Run, baseline_sha, runs  # noqa: F401

from slurm_robust.launcher.control.state import load_state
from slurm_robust.records import read_records
from slurm_robust_rehearsal.cluster import netns
from slurm_robust_rehearsal.cluster.manager import MiniCluster

WHY_NOT = netns.unavailable_reason()
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.netns,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no netns: {WHY_NOT}")]


@pytest.fixture(scope="module", autouse=True)
def netns_cluster(minicluster):
    """The session's cluster in --netns mode for this module, restored afterwards."""
    if minicluster.cfg.netns:
        yield minicluster.cfg
        return
    MiniCluster(minicluster.cfg).down()
    cfg = replace(minicluster.cfg, netns=True)
    MiniCluster(cfg).up()
    try:
        yield cfg
    finally:
        MiniCluster(cfg).down()
        MiniCluster(minicluster.cfg).up()


def _inject(env, fault: str, *args: str) -> dict:
    out = subprocess.run([*CLI, "inject", fault, "--json", *args], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_each_node_has_its_own_address(minicluster, netns_cluster):
    cfg = netns_cluster
    probe = ("import os, socket; print(os.environ['SLURMD_NODENAME'], socket.gethostname(), "
             "socket.gethostbyname(socket.gethostname()))")
    # The nodes by name: one revived by the previous test may not answer yet (srun then
    # waits for it), and the partition may hold a spare the reserve moved in.
    out = subprocess.run(["srun", "-N", str(len(cfg.train_nodes)), "-p", "train",
                          "-w", ",".join(cfg.train_nodes), sys.executable, "-c", probe],
                         env=minicluster.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    # Its own hostname too: the NodeHostname slurmctld reaches an srun on it by.
    assert all(name == host for name, host, _ in rows), rows
    seen = {name: addr for name, _, addr in rows}
    assert seen == {n: cfg.node_addr(n) for n in cfg.train_nodes}
    assert len(set(seen.values())) == len(seen) and "127.0.0.1" not in seen.values()


def test_partition_evicts_and_fences_the_node_and_keeps_the_params(runs, baseline_sha,  # noqa: F811
                                                                  minicluster, netns_cluster):
    cfg = netns_cluster
    run: Run = runs("partition")
    run.wait_step(10)
    ctl = json.loads(run.paths.controller.read_text())
    assert ctl["host"] == cfg.node_addr(ctl["node"])  # a real per-node address
    victim = spare_path_victim(load_state(run.paths.state), ctl["node"])
    old = run.paths.read_agents()[victim]
    old_pids = [int(old["agent_pid"]), *map(int, old["workers"].values())]
    assert old_pids[1:] and all(_alive(p) for p in old_pids)
    cut = _inject(minicluster.env, "partition", "--node", victim)
    try:
        inc = wait_until("the spare to take the cut node's slot", lambda: next(
            (e for e in run.events("incident") if e.get("recovered_at")), None), 60)
        # The processes on the cut node are alive at first (only the link is down).
        assert any(_alive(p) for p in old_pids) or time.time() - cut["time"] > 4
        # Keep the link down while the new generation trains, then bring it back.
        wait_until("steps after the recovery", lambda: any(
            e["time"] > inc["recovered_at"] + 2 for e in run.events("step")), 60)
    finally:
        cleared = _inject(minicluster.env, "partition", "--node", victim, "--clear")
    end = run.wait_end()
    assert (inc["class"], inc["rung"], inc["nodes"]) == ("node_lost", "spare", [victim])
    assert inc["recovered_at"] - cut["time"] < 20.0, inc
    assert inc["restore_tier"] == "peer"
    assert end["status"] == "completed" and end["params_sha256"] == baseline_sha
    # The old agent and workers stop by themselves (no Slurm call, no kill by the test).
    wait_until("the cut node's old agent and workers to stop",
               lambda: not any(_alive(p) for p in old_pids), 60)
    # Nothing from them reached the run: one incident, no requeue, no verdict but the
    # victim's, no event written after the fence that names the victim's old agent.
    incidents = run.events("incident")
    assert len(incidents) == 1, incidents
    assert not any(e.get("evidence", {}).get("controller_lost") for e in incidents)
    state = load_state(run.paths.state)
    assert state.requeues == 0 and victim not in state.slots
    verdicts = read_records(run.paths.verdicts).records
    assert [v["node"] for v in verdicts] == [victim]
    # ...nor the checkpoints: every snapshot/backup header written after the fence was
    # written by a node of the new generation.
    fence = inc["detected_at"]
    late = []
    for node in cfg.nodes:
        for sub in ("shm", "local"):
            for meta in (cfg.node_dir(node) / sub).rglob("*.meta"):
                if meta.stat().st_mtime > fence and \
                        f'"node":"{victim}"' in meta.read_bytes().decode(errors="replace") \
                        .replace(" ", ""):
                    late.append(str(meta))
    assert not late, late
    assert cleared["cleared"] and cleared["time"] > cut["time"]


def test_link_slow_delays_the_node_or_says_why_not(minicluster, netns_cluster):
    env = minicluster.env
    out = subprocess.run([*CLI, "inject", "link-slow", "--node", "node3", "--delay-ms",
                          "300", "--json"], env=env, capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        assert "netem" in out.stderr, out.stderr  # a kernel without sch_netem
        pytest.skip(f"this kernel cannot delay links: {out.stderr.strip()}")
    try:
        # A TCP connect from inside node3 to slurmctld takes a round trip.
        probe = ("import socket, time; t = time.monotonic(); "
                 f"socket.create_connection(('{netns_cluster.control_addr}', "
                 f"{netns_cluster.ctld_port}), 5).close(); print(time.monotonic() - t)")
        ns = netns.plan(netns_cluster).node("node3").netns
        timed = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe],
                               capture_output=True, text=True, timeout=30)
        assert float(timed.stdout) >= 0.3, timed
    finally:
        _inject(env, "link-slow", "--node", "node3", "--clear")
    timed = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe],
                           capture_output=True, text=True, timeout=30)
    assert float(timed.stdout) < 0.3, timed
