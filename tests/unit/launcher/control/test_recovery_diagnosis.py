"""Stop-time diagnosis in the ladder, through the recovery owner's harness.

An unclear crash (action ``diagnose``) with no node blamed is not restarted at once: the
suspected node's agent is asked (``Plan.diagnose``) to run launcher/diagnose.py while the
others wait (phase ``diagnosing``); its ``DiagnosisReport`` decides. Pass -> in place,
and the same signature again stops the run as user code; fail -> the node is blamed
(spare) with the diagnosis as evidence; no answer -> in place, nothing remembered.
"""

from __future__ import annotations

from typing import Any

from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.control.stop_diagnosis import DIAGNOSIS_WAIT_S
from slurm_robust.launcher.enums import Phase, Role
from slurm_robust.launcher.messages import DiagnosisReport, WorkerExit
from slurm_robust.launcher.paths import RunPaths
from tests.unit.launcher.control.test_recovery_owner import Harness, Member

SIG = "cuda_error:RuntimeError"


def crash(h: Harness, member: Member, action: str = "diagnose", side: str = "unknown",
          cls: str = "cuda_error", signature: str = SIG) -> None:
    rank = h.rec.ranks_of(member.index)[0]
    h.report(member, exits=[{
        "rank": rank, "gen": h.gen(), "exit_code": 1, "signal": None, "time": h.clock(),
        "class": cls, "category": "explicit", "secondary": False, "signature": signature,
        "line": "RuntimeError: CUDA error: an illegal memory access was encountered",
        "evidence": {}, "log": None, "side": side, "action": action}])


def answer(h: Harness, member: Member, passed: bool, elapsed: float = 2.5,
           evidence: dict[str, Any] | None = None) -> str:
    plan = h.rec.plan_for(member.index)
    assert plan is not None and plan.diagnose
    reason = "" if passed else "diagnosis: gpu_xid: Xid 79 on GPU 0 (fallen off the bus)"
    d = DiagnosisReport(id=plan.diagnose, node=member.node, passed=passed, complete=True,
                        elapsed_s=elapsed, reason=reason,
                        evidence=evidence or {"node": member.node, "passed": passed,
                                              "failed": [] if passed else [
                                                  {"check": "gpu_xid",
                                                   "reason": reason,
                                                   "evidence": {"xids": [79]}}]})
    member.last_seen = h.clock()
    h.rec.on_report(member, h.gen(), [], [], h.clock(), diagnoses=[d])
    return plan.diagnose


def test_ambiguous_crash_diagnosis_passes_in_place_then_repeat_stops(tmp_path):
    h = Harness(tmp_path)
    h.start()
    crash(h, h.members[1])
    detected = h.clock()
    h.settle()
    # Nobody restarted yet: n2 is asked to diagnose itself, the others wait.
    assert h.rec.phase is Phase.DIAGNOSING and h.gen() == 1
    assert h.rec.plan_for(1).diagnose and not h.rec.plan_for(0).diagnose
    assert h.rec.plan_for(1).role is Role.ACTIVE
    # An exit of a waiting peer is not a new incident while diagnosing.
    crash(h, h.members[0], cls="network", signature="network")
    h.tick(1.0)
    assert h.rec.phase is Phase.DIAGNOSING
    answer(h, h.members[1], passed=True, elapsed=2.5)
    h.tick()
    assert h.rec.phase is Phase.RUNNING and h.gen() == 2 and h.rec.gen.slots == [0, 1]
    assert not h.slurm.calls  # no verdict, no drain
    inc = h.rec.state.open_incident.to_json()
    assert inc["rung"] == "in_place" and inc["evidence"]["diagnosis"]["passed"] is True
    assert inc["localized_at"] == detected + 2.5
    assert load_state(RunPaths.of(h.cfg.run_dir).state).diagnosis_passed == [SIG]
    h.restored(3)
    h.steps(1)
    # The same signature after a passed diagnosis: user code, no second diagnosis.
    crash(h, h.members[1])
    h.settle()
    assert h.rec.phase is Phase.DONE and h.rec.result.status == "stopped"
    assert "passed stop-time diagnosis" in h.rec.result.verdict
    assert not [c for c in h.slurm.calls if c[0] in ("verdict", "drain")]
    assert h.incidents()[-1]["rung"] == "stop"


def test_ambiguous_crash_diagnosis_fails_node_goes_to_spare_with_evidence(tmp_path):
    h = Harness(tmp_path)
    h.start()
    reasons: list[str] = []
    evidences: list[dict[str, Any]] = []
    base = h.rec.slurm.verdict

    def verdict(paths: Any, job: str, node: str, reason: str, cls: str, evidence: Any,
                *rest: Any) -> None:
        reasons.append(reason)
        evidences.append(evidence)
        base(paths, job, node, reason, cls, evidence, *rest)

    h.rec.slurm.verdict = verdict
    crash(h, h.members[1])
    h.settle()
    assert h.rec.phase is Phase.DIAGNOSING
    answer(h, h.members[1], passed=False, elapsed=4.0)
    h.tick()
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 2]
    assert h.rec.plan_for(1).role is Role.EVICTED
    assert ("verdict", "n2", "cuda_error") in h.slurm.calls
    assert "Xid 79" in reasons[0]
    assert evidences[0]["diagnosis"]["failed"][0]["check"] == "gpu_xid"
    inc = h.rec.state.open_incident.to_json()
    assert inc["rung"] == "spare" and inc["nodes"] == ["n2"]
    assert load_state(RunPaths.of(h.cfg.run_dir).state).diagnosis_passed == []


def test_no_answer_within_the_budget_restarts_in_place_and_remembers_nothing(tmp_path):
    h = Harness(tmp_path)
    h.start()
    crash(h, h.members[1])
    h.settle()
    assert h.rec.phase is Phase.DIAGNOSING
    h.tick(DIAGNOSIS_WAIT_S - 1.0)
    assert h.rec.phase is Phase.DIAGNOSING
    h.tick(2.0)
    assert h.rec.phase is Phase.RUNNING and h.gen() == 2 and h.rec.gen.slots == [0, 1]
    assert h.rec.state.diagnosis_passed == []
    assert "no answer" in h.rec.state.open_incident.to_json()["evidence"]["diagnosis"]["answer"]


def test_a_user_side_crash_is_not_diagnosed(tmp_path):
    h = Harness(tmp_path)
    h.start()
    crash(h, h.members[1], action="stop_on_repeat", side="user", cls="user_cuda_fault",
          signature="user_cuda_fault:RuntimeError")
    h.settle()
    assert h.rec.phase is Phase.RUNNING and h.gen() == 2
    assert not h.rec.plan_for(1).diagnose


def test_a_diagnosis_from_another_node_is_ignored(tmp_path):
    h = Harness(tmp_path)
    h.start()
    crash(h, h.members[1])
    h.settle()
    did = h.rec.plan_for(1).diagnose
    liar = DiagnosisReport(id=did, node=h.members[0].node, passed=True, complete=True,
                           elapsed_s=1.0)
    h.rec.on_report(h.members[0], h.gen(), [], [], h.clock(), diagnoses=[liar])
    h.tick()
    assert h.rec.phase is Phase.DIAGNOSING


def test_worker_exit_side_and_action_are_checked():
    raw = {"rank": 0, "gen": 1, "exit_code": 1, "signal": None, "time": 1.0,
           "class": "cuda_error", "category": "explicit", "side": "unknown",
           "action": "diagnose"}
    ex = WorkerExit.from_json(raw)
    assert ex.side == "unknown" and ex.action == "diagnose"
    assert WorkerExit.from_json(ex.to_json()) == ex
    import pytest

    from slurm_robust.launcher.messages import BadMessage
    with pytest.raises(BadMessage, match="side 'infrastructure'"):
        WorkerExit.from_json({**raw, "action": "evict", "side": "user"})
    with pytest.raises(BadMessage, match="'action'"):
        WorkerExit.from_json({**raw, "action": "blame"})


# ------------------------------------------------- repeats that are no evidence by count
def _repeat_on_n2(h: Harness, cls: str, side: str, action: str, signatures: list[str]) -> None:
    """The same class fails on n2 once per signature; every failure but the last one is
    restarted in place (nobody blamed)."""
    for i, sig in enumerate(signatures):
        crash(h, h.members[1], action=action, side=side, cls=cls, signature=sig)
        h.settle()
        if i == len(signatures) - 1:
            return
        assert h.rec.phase is Phase.RUNNING, (i, h.incidents()[-1])
        assert h.rec.state.open_incident.to_json()["rung"] == "in_place"
        h.restored(3)
        h.steps(1)


def test_unknown_side_repeat_is_diagnosed_not_evicted_then_stops(tmp_path):
    # worker_signal (the catch-all: exit 1, no error line) three times on n2: before, the
    # count alone evicted n2 to the spare. Now the third goes to the node's own checks;
    # they pass, and the run stops naming an unknown cause, no verdict, the spare unused.
    h = Harness(tmp_path)
    h.start()
    _repeat_on_n2(h, "worker_signal", "unknown", "reattempt", ["worker_signal:1"] * 3)
    assert h.rec.phase is Phase.DIAGNOSING and h.rec.plan_for(1).diagnose
    answer(h, h.members[1], passed=True)
    h.tick()
    assert h.rec.phase is Phase.DONE and h.rec.result.status == "stopped"
    verdict = h.rec.result.verdict
    assert "an unknown cause" in verdict and "passed stop-time diagnosis" in verdict
    assert "user code" not in verdict
    assert not [c for c in h.slurm.calls if c[0] in ("verdict", "drain")]
    assert h.rec.gen.slots == [0, 1] and h.rec.state.blamed == []
    last = h.incidents()[-1]
    assert last["rung"] == "stop"
    # The record says why n2 was not blamed: the count reached the threshold, but the
    # class is no evidence against the node.
    assert last["evidence"]["blame"] == {"node_side": False, "failures": {"n2": 3},
                                         "threshold": 3}


def test_off_node_repeat_stops_as_external_after_diagnosis(tmp_path):
    h = Harness(tmp_path)
    h.start()
    _repeat_on_n2(h, "remote_storage", "infrastructure", "reattempt",
                  ["remote_storage:OSError"] * 3)
    assert h.rec.phase is Phase.DIAGNOSING
    answer(h, h.members[1], passed=True)
    h.tick()
    assert h.rec.result.status == "stopped"
    assert "an external cause (remote_storage" in h.rec.result.verdict
    assert not [c for c in h.slurm.calls if c[0] in ("verdict", "drain")]


def test_unknown_side_repeat_whose_diagnosis_fails_blames_the_node(tmp_path):
    h = Harness(tmp_path)
    h.start()
    _repeat_on_n2(h, "worker_signal", "unknown", "reattempt", ["worker_signal:1"] * 3)
    assert h.rec.phase is Phase.DIAGNOSING
    answer(h, h.members[1], passed=False)
    h.tick()
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 2]
    assert ("verdict", "n2", "worker_signal") in h.slurm.calls


def test_node_side_repeat_still_evicts_by_count(tmp_path):
    # Today's behaviour for a node-side class: the third failure on n2 blames it, no
    # diagnosis first.
    h = Harness(tmp_path)
    h.start()
    _repeat_on_n2(h, "network", "infrastructure", "reattempt", ["network"] * 3)
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 2]
    assert ("verdict", "n2", "network") in h.slurm.calls
    assert h.rec.state.open_incident.to_json()["evidence"]["blame"]["node_side"] is True


def test_unrelated_failures_adding_up_on_a_node_restart_in_place_after_diagnosis(tmp_path):
    # Three different unclear failures on n2 over a run: the third is diagnosed (the count
    # reached the threshold); it passes, and as no error came back the run goes on in
    # place, n2 kept, nothing drained.
    h = Harness(tmp_path)
    h.start()
    _repeat_on_n2(h, "worker_signal", "unknown", "reattempt",
                  ["worker_signal:1", "worker_signal:SIGSEGV", "worker_signal:SIGBUS"])
    assert h.rec.phase is Phase.DIAGNOSING
    answer(h, h.members[1], passed=True)
    h.tick()
    assert h.rec.phase is Phase.RUNNING and h.rec.gen.slots == [0, 1]
    assert h.rec.state.open_incident.to_json()["rung"] == "in_place"
    assert not [c for c in h.slurm.calls if c[0] in ("verdict", "drain")]
