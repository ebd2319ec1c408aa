"""The controller's replies: exactly what Channel.send writes, and "unchanged" only to
an agent that holds the current plan of this very controller."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest

from slurm_robust.launcher.auth import client_handshake
from slurm_robust.launcher.control.replies import ReplyEncoder, incarnation
from slurm_robust.launcher.enums import Role
from slurm_robust.launcher.messages import BadMessage, Plan, Reply
from slurm_robust.launcher.node.agent import Agent
from slurm_robust.launcher.protocol import Channel


def _sent(reply: Reply) -> bytes:
    # Channel.send's encoding of the typed reply.
    return (json.dumps(reply.to_json(), separators=(",", ":"), default=str) + "\n").encode()


def _active(nodes: list[str], **extra) -> Plan:
    return Plan(role=Role.ACTIVE, gen=3, attempt=2, world_size=len(nodes),
                master_addr="10.0.0.1", master_port=29512, rank_nodes=nodes, run_id="r1",
                max_restarts=10, slot=1, ranks=[2, 3], term=4, **extra)


def _big(nodes: int = 1024, per_node: int = 8) -> Plan:
    """An active plan of a 1,024-node, 8-rank world (node names like ``node0123``)."""
    rank_nodes = [f"node{n:04d}" for n in range(nodes) for _ in range(per_node)]
    return dataclasses.replace(_active(rank_nodes), ranks=list(range(8, 16)))


def test_replies_are_byte_identical_to_channel_send():
    enc = ReplyEncoder(incarnation(4))
    nodes = ["n1", "n1", "nœud-2", "n\"3\\"]
    plans = [_active(nodes), _active(nodes, poll_s=0.05, env={"A": "é"},
                                     command=["python", "-c", "x"]),
             Plan(role=Role.SPARE, gen=3, attempt=2), Plan(role=Role.EXIT, exit_code=0),
             _active([])]
    assert enc.encode(None) == _sent(Reply())
    for plan in plans:
        full = Reply(plan=plan, plan_id=enc.plan_id(plan))
        assert enc.encode(plan) == _sent(full)
        assert enc.encode(plan) == _sent(full)  # from the cache
        assert enc.encode(plan, "some other plan") == _sent(full)
        same = Reply(plan_id=full.plan_id, unchanged=True)
        assert enc.encode(plan, full.plan_id) == _sent(same)
        assert Reply.from_json(json.loads(enc.encode(plan))) == full
        assert Reply.from_json(json.loads(enc.encode(plan, full.plan_id))) == same


def test_a_round_of_pushes_is_byte_identical_to_pushing_each_plan_alone():
    # A decision's plans share one rank_nodes list; another list, plans without one, and
    # the text of the spliced key inside a value too.
    enc = ReplyEncoder(incarnation(4))
    nodes = ["n1", "n1", "n2", "n-3"]
    plans = [dataclasses.replace(_active(nodes), slot=i, ranks=[i]) for i in range(4)]
    plans += [None, Plan(role=Role.SPARE, gen=3, attempt=2), _active(["m1", "m2"]),
              _active(nodes, env={"X": '"rank_map":[]'}), _active([])]
    pushed = enc.encode_pushes(plans)
    for plan, (data, plan_id) in zip(plans, pushed, strict=True):
        assert (data, plan_id) == enc.encode_identified(plan, push=True)
        if plan is not None:
            assert data == _sent(Reply(plan=plan, plan_id=plan_id, push=True))
            assert Reply.from_json(json.loads(data)).plan == plan


def test_a_rank_nodes_list_changed_in_place_is_encoded_again():
    enc = ReplyEncoder(incarnation(4))
    nodes = ["n1", "n2"]
    plan = _active(nodes)
    held = enc.plan_id(plan)
    nodes[1] = "n9"
    assert enc.plan_id(plan) != held
    reply = enc.encode(plan, held)
    assert b'"n9"' in reply and reply == _sent(Reply(plan=plan, plan_id=enc.plan_id(plan)))


def test_an_unchanged_plan_at_1024_nodes_costs_a_short_reply():
    enc = ReplyEncoder(incarnation(7))
    plan = _big()
    full = enc.encode(plan)
    assert b'"rank_map":[["node[0000-1023]",8]]' in full  # 8,192 ranks as one run
    held = Reply.from_json(json.loads(full)).plan_id
    # The same plan again, as recovery.plan_for builds it: a new object, equal content.
    again = enc.encode(dataclasses.replace(plan, rank_nodes=list(plan.rank_nodes or [])),
                       held)
    assert len(again) < 200, again
    assert Reply.from_json(json.loads(again)) == Reply(plan_id=held, unchanged=True)


@pytest.mark.parametrize("change", [
    {"gen": 4}, {"poll_s": 0.05}, {"term": 5}, {"stacks": "cap-1"}, {"diagnose": "d-1"},
    {"ranks": [0, 1]}, {"drain_s": 5.0}, {"role": Role.SPARE},
    # A dual-phase replay moves a group to its next phase: same generation, the attempt
    # and the replay spec in the environment change.
    {"attempt": 3}, {"env": {"SLURM_ROBUST_REPLAY": "r1:2"}}, {"code_change": True},
])
def test_any_change_of_the_plan_sends_it_in_full(change):
    enc = ReplyEncoder(incarnation(7))
    plan = _big()
    held = enc.plan_id(plan)
    changed = dataclasses.replace(plan, **change)
    reply = enc.encode(changed, held)
    assert b'"rank_map"' in reply
    got = Reply.from_json(json.loads(reply))
    assert not got.unchanged and got.plan == changed and got.plan_id != held


def test_one_rank_node_replaced_sends_the_plan_in_full():
    enc = ReplyEncoder(incarnation(7))
    plan = _big()
    held = enc.plan_id(plan)
    nodes = list(plan.rank_nodes or [])
    nodes[8191] = "spare0001"  # a new list (a new generation's), one name differs
    reply = enc.encode(dataclasses.replace(plan, rank_nodes=nodes), held)
    assert Reply.from_json(json.loads(reply)).plan.rank_nodes[8191] == "spare0001"


def test_another_controller_never_answers_unchanged_to_a_plan_it_did_not_issue():
    # The same plan, the same term even: a second incarnation (a successor after a
    # failover, a restarted controller) names it differently, so an agent that reports
    # the first one's identity gets the plan in full.
    plan = _big()
    first, second = ReplyEncoder(incarnation(4)), ReplyEncoder(incarnation(4))
    held = first.plan_id(plan)
    assert second.plan_id(plan) != held
    assert held.split(":")[1] == second.plan_id(plan).split(":")[1]  # same content
    got = Reply.from_json(json.loads(second.encode(plan, held)))
    assert not got.unchanged and got.plan == plan
    successor = ReplyEncoder(incarnation(5))
    assert successor.plan_id(plan).startswith("5.")
    assert not Reply.from_json(json.loads(successor.encode(plan, held))).unchanged


@pytest.mark.parametrize("raw, why", [
    ({"unchanged": True}, "names a 'plan_id'"),
    ({"unchanged": True, "plan_id": "a", "plan": {}}, "carries no 'plan'"),
    ({"unchanged": 1, "plan_id": "a"}, "expected a bool"),
    ({"plan": {}, "plan_id": "a"}, "empty plan has no"),
    ({"plan": {"role": "exit"}, "plan_id": 3}, "'plan_id'"),
    ({"plan": {"role": "exit"}, "plan_id": "x" * 129}, "'plan_id'"),
    ({"plan_id": "a"}, "with 'plan'"),
    ([], "JSON object"),
])
def test_malformed_replies_are_refused(raw, why):
    with pytest.raises(BadMessage, match=why):
        Reply.from_json(raw)


def test_a_reply_without_plan_id_still_reads():
    # Both ends run the same code, but a missing identity must not crash: the agent then
    # holds no identity and its next report asks for the plan in full.
    got = Reply.from_json({"plan": {"role": "exit", "exit_code": 0}})
    assert got.plan == Plan(role=Role.EXIT, exit_code=0) and got.plan_id is None


# ---------------------------------------------------------------- over the wire
def _report(ctl, index: int, plan_id: str | None = None) -> dict:
    out = {"op": "report", "key": ctl.ident.step_key, "agent": index,
           "node": f"n{index + 1}", "pid": 100 + index, "gen": -1, "time": time.time(),
           "exits": [], "progress": [], "states": {}, "stacks": {}}
    if plan_id is not None:
        out["plan_id"] = plan_id
    return out


def _connect(ctl) -> Channel:
    info = json.loads(ctl.paths.controller.read_text())
    chan = Channel.connect(info["host"], info["port"], 30.0)
    client_handshake(chan, ctl.secret)
    return chan


def test_the_controller_answers_unchanged_only_to_its_current_plan(start_controller):
    ctl = start_controller(30.0)
    chans = [_connect(ctl), _connect(ctl)]
    try:
        deadline = time.monotonic() + 20
        replies: list[dict] = [{}, {}]
        while not all(r.get("plan") for r in replies) and time.monotonic() < deadline:
            replies = [c.request(_report(ctl, i)) for i, c in enumerate(chans)]
            time.sleep(0.05)
        full = Reply.from_json(replies[0])
        assert full.plan is not None and full.plan.role is Role.ACTIVE and full.plan_id
        assert full.plan_id.startswith(f"{ctl.term}.")
        # The agent names the plan it holds: "unchanged", a short line.
        chans[0].send(_report(ctl, 0, full.plan_id))
        line = chans[0].sock.recv(65536)
        assert len(line) < 200 and json.loads(line) == {"unchanged": True,
                                                        "plan_id": full.plan_id}
        # The same plan named by another incarnation (a predecessor's identity for it):
        # the plan in full, never "unchanged".
        other = incarnation(ctl.term - 1) + ":" + full.plan_id.split(":")[1]
        again = Reply.from_json(chans[0].request(_report(ctl, 0, other)))
        assert not again.unchanged and again.plan == full.plan
        assert again.plan_id == full.plan_id
        # No identity named (an agent on a new connection): in full.
        assert Reply.from_json(chans[0].request(_report(ctl, 0))) == full
        # The plan changes: the identity the agent holds is stale, the plan comes in full.
        with ctl.lock:
            plans = ctl.recovery.app.plans
            plans[0] = dataclasses.replace(plans[0], stacks="capture-1")
        changed = Reply.from_json(chans[0].request(_report(ctl, 0, full.plan_id)))
        assert not changed.unchanged and changed.plan is not None
        assert changed.plan.stacks == "capture-1" and changed.plan_id != full.plan_id
    finally:
        for c in chans:
            c.close()


def test_an_agent_refuses_unchanged_for_a_plan_it_does_not_hold():
    plan = Plan(role=Role.SPARE, gen=3, attempt=2)
    holder = SimpleNamespace(held=("4.aaaa:1234", plan))
    assert Agent._plan_of(holder, Reply(plan_id="4.aaaa:1234", unchanged=True)) is plan
    with pytest.raises(BadMessage, match="holds '4.aaaa:1234'"):
        Agent._plan_of(holder, Reply(plan_id="5.bbbb:1234", unchanged=True))
    with pytest.raises(BadMessage, match="holds None"):
        Agent._plan_of(SimpleNamespace(held=None), Reply(plan_id="4.aaaa:1234",
                                                          unchanged=True))
    newer = Plan(role=Role.SPARE, gen=4, attempt=3)
    assert Agent._plan_of(holder, Reply(plan=newer, plan_id="4.aaaa:5678")) is newer
