"""An external service down at start-up: backoff in place within its own budget.

The ladder alone (pure facts in, decision out), the counting into the run's state, the
option and the state file, then the recovery owner with scripted agents: the restart is
held back (agents hold, the tick keeps answering), the budget ends it with a verdict
that names the service, and no node is ever blamed for it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.ladder import Facts, decide
from slurm_robust.launcher.control.outage import backoff_s, service_of, startup_outage
from slurm_robust.launcher.control.run_facts import count_outage
from slurm_robust.launcher.control.state import RunState, load_state, save_state
from slurm_robust.launcher.enums import Phase, Role, Rung
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit.options import add_robust_options, build_config
from tests.unit.launcher.control.test_recovery_owner import SETTLE_S, Harness

HF_LINE = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', "
           "port=443): Max retries exceeded with url: /gpt2/resolve/main/config.json")
HF_SERVICE = service_of({"classifier": {"line": HF_LINE}})


def facts(**kw: Any) -> Facts:
    base: dict[str, Any] = {
        "cls": "external_service", "controller_node": "n1", "spares_left": 1,
        "restarts": 0, "max_restarts": 10, "signature": "external_service:ConnectionError",
        "signature_seen": 0, "no_progress": 0, "max_no_progress": 3, "named": ("n2",),
        "failures": {"n2": 1}, "outage_failures": 1, "outage_s": 0.0,
        "outage_service": HF_SERVICE}
    base.update(kw)
    return Facts(**base)


# ------------------------------------------------------------------ the pure parts
def test_backoff_doubles_from_the_first_wait_to_the_cap_without_jitter() -> None:
    assert [backoff_s(n, 10.0, 300.0) for n in range(0, 8)] == \
        [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    assert backoff_s(10_000, 10.0, 300.0) == 300.0  # no overflow


def test_only_an_off_node_service_class_before_the_first_step_is_an_outage() -> None:
    assert startup_outage("external_service", progressed=False)
    assert startup_outage("remote_storage", progressed=False)
    assert not startup_outage("remote_storage", progressed=True)
    assert not startup_outage("user_exception", progressed=False)


def test_the_service_is_named_as_the_classifier_saw_it() -> None:
    assert HF_SERVICE.startswith("huggingface.co: requests.exceptions.ConnectionError")
    s3 = service_of({"classifier": {"line": "botocore error reading s3://bucket/shard-7 "
                                            "(503 Slow Down)"}})
    assert s3.startswith("s3://bucket/shard-7: botocore")
    assert service_of({}, "LocalEntryNotFoundError: offline") == \
        "LocalEntryNotFoundError: offline"
    assert "no line" in service_of({})


def test_outage_at_start_up_restarts_in_place_with_a_growing_delay() -> None:
    delays = []
    for n in range(1, 8):
        d = decide(facts(outage_failures=n, outage_s=60.0 * n))
        assert d.rung is Rung.IN_PLACE and d.evict == ()
        assert "huggingface.co" in d.reason
        delays.append(d.delay_s)
    assert delays == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]


def test_outage_is_counted_against_neither_the_no_progress_nor_the_restart_budget() -> None:
    d = decide(facts(outage_failures=4, outage_s=100.0, no_progress=5, restarts=10))
    assert d.rung is Rung.IN_PLACE and d.delay_s == 80.0
    # a repeat on one node whose diagnosis passed, the same signature: still a wait
    d = decide(facts(outage_failures=3, failures={"n2": 3}, signature_seen=2,
                     diagnosis_passed=True, diagnosed_repeat=True))
    assert d.rung is Rung.IN_PLACE and d.delay_s == 40.0


def test_budget_spent_stops_naming_the_service() -> None:
    d = decide(facts(outage_failures=9, outage_s=31 * 60 - 20.0))
    assert d.rung is Rung.STOP and d.delay_s == 0.0
    assert d.reason.startswith("external service unreachable for 31 min: huggingface.co")
    assert "user" not in d.reason and "no step finished" not in d.reason
    storage = decide(facts(cls="remote_storage", outage_s=1800.0,
                           outage_service="s3://bucket/x: FSTimeoutError"))
    assert storage.reason.startswith("remote storage unreachable for 30 min: s3://bucket/x")


def test_a_node_the_evidence_blames_still_gets_a_spare() -> None:
    d = decide(facts(blame_named=True, evict_reason="in-job monitor on n2: gpu_xid"))
    assert d.rung is Rung.SPARE and d.evict == ("n2",) and d.delay_s == 0.0


def test_remote_storage_after_progress_behaves_as_before() -> None:
    d = decide(facts(cls="remote_storage", outage_failures=0, outage_service=None,
                     no_progress=0))
    assert d.rung is Rung.IN_PLACE and d.delay_s == 0.0
    assert d.reason == "remote_storage: restarting in place from the latest snapshot"
    stop = decide(facts(cls="remote_storage", outage_failures=0, no_progress=3))
    assert stop.rung is Rung.STOP and "no step finished in 3 attempts" in stop.reason


def test_off_node_repeats_never_blame_the_node() -> None:
    for cls in ("external_service", "remote_storage"):
        for outage in (0, 5):
            d = decide(facts(cls=cls, outage_failures=outage, failures={"n2": 9},
                             failures_to_blame=3, side="infrastructure"))
            assert d.evict == (), (cls, outage)


def test_facts_and_decisions_round_trip_with_the_outage_fields() -> None:
    f = facts(outage_failures=2, outage_s=12.5)
    assert Facts.from_json(json.loads(json.dumps(f.to_json()))) == f
    # a trace line from before the outage fields: they default to no outage
    old = {k: v for k, v in f.to_json().items() if not k.startswith("outage")}
    assert Facts.from_json(old).outage_failures == 0


# ------------------------------------------------------------------ counting, state
def test_counting_progress_or_another_class_ends_the_outage() -> None:
    st = RunState()
    assert count_outage(st, "external_service", False, 100.0)
    assert count_outage(st, "remote_storage", False, 130.0)
    assert (st.outage_since, st.outage_failures) == (100.0, 2)
    assert not count_outage(st, "time_limit", False, 140.0)  # a requeue: goes on
    assert (st.outage_since, st.outage_failures) == (100.0, 2)
    assert not count_outage(st, "user_exception", False, 150.0)
    assert (st.outage_since, st.outage_failures, st.outage_not_before) == (None, 0, None)
    assert count_outage(st, "external_service", False, 160.0)
    assert not count_outage(st, "external_service", True, 170.0)  # progress made
    assert st.outage_since is None and st.outage_failures == 0


def test_state_round_trips_the_outage_and_older_files_default(tmp_path) -> None:
    path = tmp_path / "state.json"
    st = RunState(attempt=4, outage_since=100.5, outage_failures=3, outage_not_before=180.5)
    save_state(path, st)
    assert load_state(path) == st
    raw = json.loads(path.read_text())
    for key in ("outage_since", "outage_failures", "outage_not_before"):
        del raw[key]
    path.write_text(json.dumps(raw))
    path.chmod(0o600)
    old = load_state(path)
    assert (old.outage_since, old.outage_failures, old.outage_not_before) == (None, 0, None)


def test_options_and_config(tmp_path) -> None:
    p = argparse.ArgumentParser()
    add_robust_options(p)
    args = p.parse_args(["--folder", str(tmp_path), "--outage-budget", "120",
                         "--outage-backoff", "1", "--outage-backoff-max", "4",
                         "--", sys.executable, "t.py"])
    cfg = build_config(args, 1, None)
    assert (cfg.outage_budget_s, cfg.outage_backoff_s, cfg.outage_backoff_max_s) == \
        (120.0, 1.0, 4.0)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    default = build_config(p.parse_args(["--folder", str(tmp_path), "--", "x"]), 1, None)
    assert (default.outage_budget_s, default.outage_backoff_s,
            default.outage_backoff_max_s) == (1800.0, 10.0, 300.0)
    with pytest.raises(UsageError, match="outage_backoff_s"):
        RunConfig(command=("x",), run_dir=str(tmp_path), outage_backoff_s=60,
                  outage_backoff_max_s=30)
    with pytest.raises(UsageError, match="outage_budget_s"):
        RunConfig(command=("x",), run_dir=str(tmp_path), outage_budget_s=-1)


# ------------------------------------------------------------------ the recovery owner
def hub_down(h: Harness, index: int = 1, cls: str = "external_service") -> None:
    """Agent ``index``'s rank fails as huggingface_hub does when the Hub is down."""
    member = h.members[index]
    rank = h.rec.ranks_of(member.index)[0]
    h.report(member, exits=[{
        "rank": rank, "gen": h.gen(), "exit_code": 1, "signal": None,
        "time": h.clock(), "class": cls, "category": "explicit", "secondary": False,
        "signature": f"{cls}:ConnectionError", "line": HF_LINE, "side": "unknown",
        "evidence": {"classifier": {"rule": "external", "strength": "generic",
                                    "line": HF_LINE, "source": "log", "side": "unknown"}},
        "log": None}])


def outage_harness(tmp_path) -> Harness:
    """Started, three steps done, then a fresh generation that has not stepped yet."""
    h = Harness(tmp_path, outage_budget_s=100.0, outage_backoff_s=10.0,
                outage_backoff_max_s=40.0, max_restarts=2)
    h.start()
    h.fail(h.members[1], "worker_signal")
    h.settle()
    assert h.gen() == 2
    return h


def test_the_restart_waits_out_its_backoff_while_the_tick_answers(tmp_path) -> None:
    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    st = h.rec.state
    assert h.gen() == 2 and h.rec.phase is Phase.RUNNING  # held, not restarted
    assert st.outage_failures == 1 and st.outage_not_before == pytest.approx(
        h.clock() - 0.05 + 10.0, abs=0.1)
    assert {h.rec.plan_for(i).role for i in (0, 1)} == {Role.HOLD}
    assert h.rec.plan_for(2).role == Role.SPARE
    assert h.rec.plan_for(0).poll_s is None  # no hurry while backing off
    assert load_state(RunPaths.of(h.cfg.run_dir).state).outage_not_before == \
        st.outage_not_before
    incident = st.open_incident.to_json()
    assert incident["rung"] == "in_place"
    assert incident["evidence"]["outage"]["backoff_s"] == 10.0
    assert incident["evidence"]["outage"]["service"] == HF_SERVICE
    h.tick(5.0)
    assert h.gen() == 2  # not yet
    h.tick(5.0)
    assert h.gen() == 3 and h.rec.plan_for(0).role == Role.ACTIVE
    assert st.outage_not_before is None and st.restarts == 1 and st.no_progress == 0

    hub_down(h)
    h.settle()
    assert st.outage_failures == 2 and st.open_incident.evidence["outage"]["backoff_s"] == 20
    h.tick(19.0)
    assert h.gen() == 3
    h.tick(1.0)
    assert h.gen() == 4
    # neither budget moved: the old one would have stopped after the third attempt
    assert st.restarts == 1 and st.no_progress == 0


def test_the_budget_spent_stops_the_run_naming_the_service_and_blames_no_node(
        tmp_path) -> None:
    h = outage_harness(tmp_path)
    attempts = 0
    while h.rec.phase is not Phase.DONE and attempts < 12:
        attempts += 1
        hub_down(h)
        h.settle()
        if h.rec.phase is not Phase.DONE:
            h.tick(h.rec.state.outage_not_before - h.clock())
    assert h.rec.phase is Phase.DONE and attempts == 5  # 10 + 20 + 40 + 40 s waited
    assert h.rec.result.status == "stopped"
    verdict = h.rec.result.verdict
    assert verdict.startswith("external service unreachable for 2 min: huggingface.co")
    assert "no node is blamed" in verdict
    assert h.rec.state.blamed == [] and h.slurm.calls == []
    assert h.rec.state.restarts == 1  # only the worker_signal restart counted
    last = h.incidents()[-1]
    assert last["rung"] == "stop" and last["evidence"]["outage"]["backoff_s"] is None


def test_progress_resets_the_outage_clock(tmp_path) -> None:
    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    h.tick(10.0)
    assert h.gen() == 3
    h.restored(3)
    h.steps(1)
    st = h.rec.state
    assert (st.outage_since, st.outage_failures) == (None, 0)
    # a remote_storage failure after progress: restarted at once, as before
    hub_down(h, index=0, cls="remote_storage")
    h.settle()
    assert h.gen() == 4 and st.outage_failures == 0
    assert st.open_incident.evidence["decision"] == \
        "remote_storage: restarting in place from the latest snapshot"
    assert "outage" not in st.open_incident.evidence


def test_a_slot_agent_lost_during_the_backoff_goes_to_the_ladder_at_once(tmp_path) -> None:
    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    assert h.gen() == 2
    h.members[1].lost = True
    h.rec.on_agent_lost(h.members[1], True, h.clock())
    h.tick(0.0)  # the wait ends
    h.settle()  # node_lost: spare
    assert h.gen() == 3 and h.rec.gen.slots == [0, 2]
    assert h.rec.state.outage_failures == 0  # another class ended the outage


def test_a_requeue_carries_the_backoff_to_the_next_allocation(tmp_path) -> None:
    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    not_before = h.rec.state.outage_not_before
    # the next allocation's controller, from the same state.json
    nxt = Harness(tmp_path, outage_budget_s=100.0, outage_backoff_s=10.0,
                  outage_backoff_max_s=40.0, max_restarts=2)
    nxt.clock.t = h.clock()
    nxt.tick()
    assert nxt.rec.phase is Phase.RUNNING and nxt.rec.gen is None
    assert nxt.rec.plan_for(0).role == Role.HOLD
    nxt.tick(not_before - nxt.clock() + SETTLE_S)
    assert nxt.rec.gen is not None and nxt.rec.plan_for(0).role == Role.ACTIVE
    assert nxt.rec.state.outage_failures == 1  # the outage goes on in this allocation


def test_a_successor_controller_waits_out_the_same_backoff(tmp_path) -> None:
    from slurm_robust.launcher.control.failover import Takeover
    from slurm_robust.launcher.control.recovery import Recovery

    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    held_gen, not_before = h.gen(), h.rec.state.outage_not_before
    successor = Recovery(h.cfg, h.rec.ident, h.members, expected=h.cfg.total_nodes,
                         slurm=h.rec.slurm, clock=h.clock,
                         takeover=Takeover(term=1, lost_agent=None, lost_node=None))
    successor.tick(h.clock.advance(1.0))
    assert successor.phase is Phase.RUNNING and successor.gen.number == held_gen
    assert {successor.plan_for(i).role for i in (0, 1)} == {Role.HOLD}
    successor.tick(h.clock.advance(not_before - h.clock() - 0.5))
    assert successor.gen.number == held_gen  # not yet
    successor.tick(h.clock.advance(1.0))
    assert successor.gen.number == held_gen + 1
    assert successor.plan_for(0).role == Role.ACTIVE
    assert successor.state.outage_not_before is None
    assert successor.state.outage_failures == 1


def test_status_says_the_run_is_backing_off_and_from_what(tmp_path) -> None:
    from slurm_robust.launcher.submit.status import run_status

    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    h.rec.app.events.flush_step()
    pending = run_status(h.cfg.run_dir)["pending"]
    assert pending.startswith("backing off: huggingface.co: requests.exceptions"), pending
    assert "(1 attempt(s)); the next attempt starts at " in pending
    h.tick(10.0)
    assert run_status(h.cfg.run_dir)["pending"] is None  # the generation started


def test_the_time_limit_during_a_backoff_requeues_and_keeps_the_outage(tmp_path) -> None:
    h = outage_harness(tmp_path)
    hub_down(h)
    h.settle()
    assert h.rec.app.backoff is not None
    h.rec.on_time_limit(h.members[0], h.clock())
    h.tick(0.0)
    h.wait_slurm()
    assert h.rec.phase is Phase.REQUEUED
    assert [c[0] for c in h.slurm.calls] == ["requeue"]
    st = load_state(RunPaths.of(h.cfg.run_dir).state)
    assert st.outage_failures == 1 and st.outage_not_before is not None
    assert st.blamed == []
