"""The controller's reply encoder writes exactly what Channel.send writes."""

from __future__ import annotations

import json

from slurm_robust.launcher.control.replies import ReplyEncoder
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.messages import Plan


def _sent(plan: Plan | None) -> bytes:
    # Channel.send's encoding of the reply the controller used to build.
    message = {"plan": plan.to_json() if plan is not None else {}}
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


def _active(nodes: list[str], **extra) -> Plan:
    return Plan(role=Role.ACTIVE, gen=3, attempt=2, world_size=len(nodes),
                master_addr="10.0.0.1", master_port=29512, rank_nodes=nodes, run_id="r1",
                max_restarts=10, slot=1, ranks=[2, 3], term=4, **extra)


def test_replies_are_byte_identical_to_channel_send():
    enc = ReplyEncoder()
    nodes = ["n1", "n1", "nœud-2", "n\"3\\"]
    plans = [None, _active(nodes), _active(nodes, poll_s=0.05, env={"A": "é"},
                                             command=["python", "-c", "x"]),
             Plan(role=Role.SPARE, gen=3, attempt=2), Plan(role=Role.EXIT, exit_code=0),
             _active([])]
    for plan in plans:
        assert enc.encode(plan) == _sent(plan)
        assert enc.encode(plan) == _sent(plan)  # from the cache


def test_a_rank_nodes_list_changed_in_place_is_encoded_again():
    enc = ReplyEncoder()
    nodes = ["n1", "n2"]
    plan = _active(nodes)
    assert enc.encode(plan) == _sent(plan)
    nodes[1] = "n9"
    assert b'"n9"' in enc.encode(plan) and enc.encode(plan) == _sent(plan)

