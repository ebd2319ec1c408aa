"""The compact form of the node of every rank (launcher/rank_map.py): exact round trips,
the size that keeps a 4,096-node plan and a worker's environment small, and refusals."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.ckpt import CheckpointConfig
from slurm_robust.launcher import rank_map
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.messages import BadMessage, Plan, Reply
from slurm_robust.launcher.node.workers import worker_env
from slurm_robust.train import rank_nodes_from_env

#: Linux's limit for one environment string (MAX_ARG_STRLEN: 32 pages of 4 KiB).
MAX_ARG_STRLEN = 32 * 4096


def ranks_of(nodes: list[str], per_node: int) -> list[str]:
    return [n for n in nodes for _ in range(per_node)]


def test_a_numbered_job_is_one_run():
    nodes = [f"node{i:04d}" for i in range(1, 4097)]
    runs = rank_map.encode(ranks_of(nodes, 8))
    assert runs == [["node[0001-4096]", 8]]
    assert rank_map.decode(runs) == ranks_of(nodes, 8)


def test_a_spare_in_a_lost_nodes_place_splits_the_run_and_keeps_the_order():
    nodes = [f"gpu-a100-rack07-node{i:03d}" for i in range(1, 11)]
    nodes[4] = "spare02"
    runs = rank_map.encode(ranks_of(nodes, 8))
    assert runs == [["gpu-a100-rack07-node[001-004]", 8], ["spare02", 8],
                    ["gpu-a100-rack07-node[006-010]", 8]]
    assert rank_map.decode(runs) == ranks_of(nodes, 8)


def test_names_across_a_digit_width_and_unnumbered_names_stay_exact():
    nodes = ["node8", "node9", "node10", "node11", "login", "a1b", "a2b", "x", "x"]
    flat = ["node8", "node9", "node10", "node11", "login", "a1b", "a2b", "x", "x", "x"]
    assert rank_map.decode(rank_map.encode(flat)) == flat
    runs = rank_map.encode(ranks_of(nodes[:4], 2))
    assert runs == [["node[8-9]", 2], ["node[10-11]", 2]]


def test_random_layouts_round_trip():
    rng = random.Random(7)
    for _ in range(300):
        names = [rng.choice(["n", "node", "gpu-", "r1n"]) + str(rng.randint(0, 120)).zfill(
            rng.choice([1, 3])) + rng.choice(["", "-ib"]) for _ in range(rng.randint(0, 40))]
        flat = [n for n in names for _ in range(rng.randint(1, 4))]
        assert rank_map.decode(rank_map.encode(flat)) == flat


def test_4096_nodes_fit_a_reply_and_a_worker_environment_that_names_would_not():
    nodes = [f"gpu-a100-rack{i // 64:02d}-node{i % 64:03d}" for i in range(4096)]
    flat = ranks_of(nodes, 8)
    compact = json.dumps(rank_map.encode(flat), separators=(",", ":"))
    assert len(compact) < 8192  # 64 racks: one run each
    assert len(json.dumps(flat)) > MAX_ARG_STRLEN  # what the old form put in the env


@pytest.mark.parametrize("bad", [
    "node[1-4]", [["node[4-1]", 8]], [["node[01-4]", 8]], [["node[1-2", 8]],
    [["node", 0]], [["node", True]], [["", 8]], [["node"]], [[3, 8]],
    [["node[0-9999999]", 8]], [["a[1-2]b[3-4]", 1]]])
def test_malformed_maps_are_refused(bad):
    with pytest.raises(rank_map.RankMapError):
        rank_map.decode(bad)


def test_a_map_too_large_to_expand_is_refused_before_it_is_built():
    with pytest.raises(rank_map.RankMapError, match="past"):
        rank_map.decode([["n[000001-900000]", 8]])


def test_a_name_with_brackets_cannot_be_encoded():
    with pytest.raises(rank_map.RankMapError):
        rank_map.encode(["node[1]"])


def test_a_plan_carries_the_runs_on_the_wire_and_the_names_in_memory():
    nodes = ranks_of([f"node{i}" for i in range(1, 4)], 2)
    plan = Plan(role=Role.ACTIVE, gen=1, attempt=0, world_size=6, master_addr="node1",
                master_port=29500, rank_nodes=nodes, slot=0, ranks=[0, 1])
    wire = plan.to_json()
    assert wire["rank_map"] == [["node[1-3]", 2]] and "rank_nodes" not in wire
    assert Plan.from_json(json.loads(json.dumps(wire))).rank_nodes == nodes
    bad = {**wire, "rank_map": [["node[3-1]", 2]]}
    with pytest.raises(BadMessage, match="rank_map"):
        Reply.from_json({"plan": bad, "plan_id": "1.x:y"})


def test_a_4096_node_workers_environment_starts_a_process_and_reads_back(tmp_path):
    # The real path: the agent's worker_env, execve of a child, and the worker-side reader.
    nodes = [f"gpu-a100-rack{i // 64:02d}-node{i % 64:03d}" for i in range(4096)]
    flat = ranks_of(nodes, 8)
    plan = Plan(role=Role.ACTIVE, gen=1, attempt=0, world_size=len(flat),
                master_addr=nodes[0], master_port=29500, rank_nodes=flat, slot=5,
                ranks=list(range(40, 48)))
    env = worker_env({"PATH": "/usr/bin:/bin"}, plan, 41, 1, nodes[5], "7", str(tmp_path),
                     Path(tmp_path / "p"), CheckpointConfig(), {})
    assert len(env["SLURM_ROBUST_RANK_NODES"]) < 8192
    probe = ("from slurm_robust.train import rank_nodes_from_env as f; n = f(); "
             "print(len(n), n[41], n[-1])")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out == [str(len(flat)), nodes[5], nodes[-1]]


def test_no_rank_map_in_the_environment_reads_as_none(monkeypatch):
    monkeypatch.delenv("SLURM_ROBUST_RANK_NODES", raising=False)
    assert rank_nodes_from_env() is None
    monkeypatch.setenv("SLURM_ROBUST_RANK_NODES", "null")
    assert rank_nodes_from_env() is None
    monkeypatch.setenv("SLURM_ROBUST_RANK_NODES", '[["n[2-1]", 8]]')
    with pytest.raises(RuntimeError, match="SLURM_ROBUST_RANK_NODES"):
        rank_nodes_from_env()


def test_the_last_map_decoded_is_kept_whole_and_each_caller_gets_its_own_list():
    runs = [["last[001-512]", 8], ["other7", 2]]
    first = rank_map.decode(runs)
    first.append("mine")
    again = rank_map.decode(runs)
    assert len(again) == 512 * 8 + 2 and again[-1] == "other7"
    assert again is not first
    # A malformed map is never served from what was kept: refused with its reason.
    with pytest.raises(rank_map.RankMapError, match="run 0"):
        rank_map.decode([["last[001-512]", 0]])
