"""Typed messages: round trips, refusal at the boundary, and the controller's handler
closing only the connection that sent a bad report."""

from __future__ import annotations

import dataclasses
import json

import pytest

from slurm_robust.ckpt import CheckpointConfig
from slurm_robust.ckpt.config import CKPT_ENV
from slurm_robust.errors import UsageError
from slurm_robust.launcher.auth import client_handshake
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.control.events import INCIDENT_FIELDS
from slurm_robust.launcher.enums import Category, ProgressKind, Role, Rung
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.messages import (
    BadMessage,
    Incident,
    IncidentRecord,
    Plan,
    Report,
    WorkerExit,
    plan_from_reply,
)
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.protocol import Channel, ChannelClosed

FAILURE = {"rank": 3, "gen": 2, "exit_code": -9, "signal": 9, "time": 5.5,
           "class": "worker_crash", "category": "explicit", "secondary": False,
           "signature": None, "line": "killed by SIGKILL", "evidence": {"signal": 9},
           "log": "/run/logs/g2/rank3.log", "side": "unknown", "action": "reattempt"}
REPORT = {"op": "report", "agent": 1, "node": "n2", "pid": 77, "addr": "10.0.0.2",
          "key": "42.0.0", "gen": 2, "role": "active", "exits": [FAILURE],
          "progress": [{"kind": "step", "rank": 3, "step": 9, "loss": 0.5, "grad_norm": 1.0,
                        "t": 4.0, "busy_s": 0.1},
                       {"kind": "anomaly", "rank": 3, "step": 9, "what": "nan"}],
          "states": {"3": "R"}, "stacks": {}, "time": 6.0,
          "diagnoses": [{"id": "i1-g2", "node": "n2", "passed": False, "complete": True,
                         "elapsed_s": 3.5, "reason": "diagnosis: gpu_xid: Xid 79",
                         "evidence": {"failed": [{"check": "gpu_xid"}]}}]}


def wire(obj: dict) -> dict:
    return json.loads(json.dumps(obj))


def test_report_round_trip_keeps_the_wire() -> None:
    report = Report.from_json(REPORT)
    assert report.role is Role.ACTIVE
    exit_ = report.exits[0]
    assert exit_.cls == "worker_crash" and exit_.category is Category.EXPLICIT
    assert report.progress[1].kind is ProgressKind.ANOMALY
    assert report.progress[1].extra == {"what": "nan"}  # unknown keys travel on
    assert wire(report.to_json()) == wire(REPORT)


def test_success_exit_and_lean_plans_keep_todays_shape() -> None:
    ok = {"rank": 0, "gen": 1, "exit_code": 0, "signal": None, "time": 1.0}
    assert WorkerExit.from_json(ok).to_json() == ok
    exit_plan = {"role": "exit", "exit_code": 0, "purge": True}
    assert Plan.from_json(exit_plan).to_json() == exit_plan
    spare = {"gen": 3, "role": "spare", "attempt": 2}
    assert Plan.from_json(spare).to_json() == {"role": "spare", "gen": 3, "attempt": 2}
    assert plan_from_reply({"plan": {}}) is None


def test_incident_keeps_the_documented_order() -> None:
    inc = Incident(incident="i1", category=Category.EXPLICIT, cls="oom", fault_time=None,
                   detected_at=3.0, rung=Rung.IN_PLACE)
    out = inc.to_json()
    assert list(out)[:3] == ["incident", "category", "class"] and out["rung"] == "in_place"
    assert Incident.from_json(wire(out)) == inc


def test_an_incident_record_is_its_state_form_without_cut_short() -> None:
    earlier = Incident(incident="i0", category=Category.EXPLICIT, cls="oom",
                       fault_time=1.0, detected_at=2.0)
    inc = Incident(incident="i1", category=Category.IMPLICIT, cls="job_hang", fault_time=2.5,
                   detected_at=3.0, rung=Rung.IN_PLACE, nodes=["n1"], ranks=[0, 1],
                   evidence={"stacks": "/s"}, cut_short=[earlier])
    full = inc.to_json()
    assert list(full)[-1] == "_cut_short" and full["_cut_short"] == [earlier.to_json()]
    rest = {k: v for k, v in full.items() if k != "_cut_short"}
    assert json.dumps(inc.record()) == json.dumps(rest)
    assert "_cut_short" not in earlier.to_json()
    assert json.dumps(inc.state()) == json.dumps(full)
    assert json.dumps(earlier.state()) == json.dumps(earlier.to_json())
    assert tuple(IncidentRecord.__annotations__) == INCIDENT_FIELDS


def test_a_report_leaves_out_only_the_optional_fields_it_does_not_use() -> None:
    bare = Report.from_json(REPORT).to_json()
    assert not {"findings", "sample", "term", "warned", "ending", "plan_id"} & set(bare)
    full = {**REPORT, "term": 2, "warned": 0.0, "ending": 7.0, "plan_id": "p1",
            "findings": [{"kind": "gpu", "check": "gpu_ecc", "severity": "warning",
                          "reason": "r", "time": 1.0, "class": None, "evidence": {}}],
            "sample": {"time": 1.0, "gpu_util": None, "sm_clock_mhz": None,
                       "net_bytes_per_s": None, "rdma_bytes_per_s": None}}
    out = Report.from_json(full).to_json()
    assert wire(out) == wire(full)
    assert list(out) == [f.name for f in dataclasses.fields(Report)]  # the fields' order


@pytest.mark.parametrize("raw, message", [
    ({k: v for k, v in REPORT.items() if k != "node"}, "missing field 'node'"),
    ({**REPORT, "agent": "1"}, "field 'agent'"),
    ({**REPORT, "agent": True}, "field 'agent'"),  # a bool is not an index
    ({**REPORT, "op": "hello"}, "unknown message kind 'hello'"),
    ({**REPORT, "role": "boss"}, "field 'role'"),
    ({**REPORT, "exits": [{**FAILURE, "gen": None}]}, "report.exits[0]: field 'gen'"),
    ({**REPORT, "exits": [{k: v for k, v in FAILURE.items() if k != "class"}]},
     "needs 'class'"),
    ({**REPORT, "progress": [{"kind": "teleport", "rank": 0}]}, "field 'kind'"),
    ({**REPORT, "progress": [{"kind": "step", "rank": 0}]}, "a step line needs 'step'"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_reports_are_refused_with_one_exception(raw, message) -> None:
    with pytest.raises(BadMessage, match=message.replace("[", r"\[").replace("]", r"\]")):
        Report.from_json(raw)


def test_bad_plans_are_refused() -> None:
    with pytest.raises(BadMessage, match="lacks"):
        Plan.from_json({"role": "active", "gen": 1})
    with pytest.raises(BadMessage, match="needs 'gen'"):
        Plan.from_json({"role": "spare"})
    with pytest.raises(BadMessage, match="with 'plan'"):
        plan_from_reply({"nope": 1})
    for bad in (0, -1, 61):
        with pytest.raises(BadMessage, match="poll_s"):
            Plan.from_json({"role": "spare", "gen": 1, "poll_s": bad})
    assert Plan.from_json({"role": "spare", "gen": 1, "poll_s": 0.05}).poll_s == 0.05


ACTIVE = {"role": "active", "gen": 1, "attempt": 0, "world_size": 4, "master_addr": "a",
          "master_port": 1, "rank_map": [["n[1-2]", 2]], "slot": 0,
          "ranks": [0, 1]}


@pytest.mark.parametrize("field, items", [
    ("rank_map", [["n1", 2], ["n2", "2"]]), ("rank_map", [["n1", 2], [None, 2]]),
    ("ranks", [0, True]), ("ranks", [0, 1.0]), ("ranks", [0, "1"])])
def test_a_list_with_one_item_of_another_type_is_refused(field, items) -> None:
    # Lists are checked by their items' exact types first (fast on long lists);
    # a bool is no int, as for a single field.
    with pytest.raises(BadMessage, match=f"field '{field}'"):
        Plan.from_json({**ACTIVE, field: items})


def test_a_list_of_str_subclasses_still_reads() -> None:
    plan = Plan.from_json({**ACTIVE, "rank_map": [[Role.ACTIVE, 1], ["n1", 1], ["n2", 2]]})
    assert plan.rank_nodes == ["active", "n1", "n2", "n2"]


def test_checkpoint_config_crosses_the_environment() -> None:
    cfg = CheckpointConfig(shm_root="/dev/shm/x", local_root="/l", durable_root=None,
                           local_every=5, peer_backup=False, peer_slots=2)
    env = cfg.to_env()
    assert list(env) == [CKPT_ENV]
    assert CheckpointConfig.from_env(env) == cfg
    assert CheckpointConfig.from_env({}) == CheckpointConfig()
    assert CheckpointConfig.from_env({}, peer_backup=False).peer_backup is False
    with pytest.raises(UsageError, match=CKPT_ENV):
        CheckpointConfig.from_env({CKPT_ENV: "[1]"})


def _authed(ctl: Controller, info: dict) -> Channel:
    """A connection to the controller that passed the run-secret handshake."""
    chan = Channel.connect(info["host"], info["port"], 5.0)
    client_handshake(chan, ctl.secret)
    return chan


def test_the_controller_closes_only_the_bad_connection(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    cfg = RunConfig(command=("x",), run_dir=str(tmp_path / "run"), nodes=1,
                    startup_timeout_s=30.0)
    ctl = Controller(cfg, Identity(0, "n1", "42", "42.0.0", 0))
    ctl.start()
    try:
        info = json.loads(RunPaths.of(cfg.run_dir).controller.read_text())
        bad = _authed(ctl, info)
        with pytest.raises(ChannelClosed):
            bad.request({**REPORT, "op": "hello"})
        bad.close()
        good = _authed(ctl, info)
        reply = good.request({**REPORT, "agent": 0, "node": "n1", "exits": [],
                              "progress": [], "gen": -1, "role": "new"})
        good.close()
        assert "plan" in reply  # the controller still answers
        assert ctl._thread is not None and ctl._thread.is_alive()
    finally:
        with ctl.lock:
            ctl.recovery.fail("test over")
        last = _authed(ctl, info)
        assert last.request({**REPORT, "agent": 0, "node": "n1", "exits": [], "progress": [],
                             "gen": -1, "role": "new"})["plan"]["role"] == "exit"
        last.close()
        ctl.join()
