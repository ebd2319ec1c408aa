"""One ladder for the launcher and the fleet simulator.

``tests/data/ladder_trace.jsonl`` is a trace of incident facts and the decisions the
ladder made for them, recorded from the code before the ladder was one function (the
rung from ``policy.decide``, then the five refinements the recovery owner made: NaN
advice, hot-update rollback, evict reason, diagnosis reason, blame cap). Its cases are
those the policy, blame, failover and recovery tests cover. Each line is replayed through
the launcher's ladder and the simulator's and must give the recorded decision in both.

The other two tests record a trace from a live run of each side (the launcher's
recovery owner with scripted agents, a small simulated fleet) and replay it through the
other side's ladder: what the launcher's applier applied (the incident's rung and reason) must be
exactly what the simulator would decide from the same facts, and back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_robust.launcher.control import applier
from slurm_robust.launcher.control.ladder import Decision, Facts, decision_from_json
from slurm_robust.simulate import job as sim_job
from slurm_robust.simulate.engine import simulate
from tests.unit.launcher.control.test_recovery_owner import Harness
from tests.unit.simulate.helpers import GPU, config, incident

TRACE = Path(__file__).resolve().parents[3] / "data" / "ladder_trace.jsonl"


def _trace() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]


def _record(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple[Facts, Decision]]:
    """Record every (facts, decision) the module's ladder call makes."""
    seen: list[tuple[Facts, Decision]] = []
    real = module.decide

    def recording(facts: Facts) -> Decision:
        decision = real(facts)
        seen.append((facts, decision))
        return decision

    monkeypatch.setattr(module, "decide", recording)
    return seen


@pytest.mark.parametrize("line", _trace(), ids=lambda line: line["case"])
def test_recorded_trace_gives_the_same_decisions_on_both_sides(line: dict[str, Any]) -> None:
    facts = Facts.from_json(line["facts"])
    expected = decision_from_json(line["decision"])
    assert applier.decide(facts) == expected
    assert sim_job.decide(facts) == expected
    assert Facts.from_json(json.loads(json.dumps(facts.to_json()))) == facts


def test_trace_covers_every_rung_and_refinement() -> None:
    lines = _trace()
    assert {line["decision"]["rung"] for line in lines} == \
        {"in_place", "spare", "requeue", "stop"}
    facts = [line["facts"] for line in lines]
    for key in ("nan_advice", "evict_reason", "rollback", "diagnosis_reason"):
        assert any(f.get(key) for f in facts), key
    assert any("blame cap" in line["decision"]["reason"] for line in lines)
    assert any(line["decision"]["batch_lost"] for line in lines)


def test_the_launchers_decisions_replay_through_the_simulator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record(monkeypatch, applier)
    h = Harness(tmp_path)
    h.start()
    h.fail(h.members[1], "user_exception", signature="TypeError@t.py:3")
    h.settle()  # in place
    h.restored(3)
    h.steps(2)
    h.fail(h.members[1], "gpu_memory_error")
    h.settle()  # spare
    h.restored(5)
    h.steps(1)
    h.fail(h.members[0], "user_exception", signature="TypeError@t.py:3")
    h.settle()  # the same user error again: stop
    rungs = [d.rung for _, d in seen]
    assert rungs == ["in_place", "spare", "stop"]
    written = h.incidents()
    assert len(written) == len(seen)
    for (facts, decision), inc in zip(seen, written, strict=True):
        assert sim_job.decide(facts) == decision
        # What the launcher applied is the ladder's decision, unchanged.
        assert inc["rung"] == decision.rung and inc["evidence"]["decision"] == decision.reason


def test_the_simulators_decisions_replay_through_the_launcher(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record(monkeypatch, sim_job)
    trace = [incident(1000.0, GPU, slot=2, index=0), incident(5000.0, GPU, slot=4, index=1),
             incident(9000.0, index=2), incident(12000.0, GPU, slot=0, index=3)]
    result = simulate(config(trace, spares=1))
    assert [d.rung for _, d in seen] == ["spare", "requeue", "in_place", "requeue"]
    for (facts, decision), inc in zip(seen, result.job.incidents, strict=True):
        assert applier.decide(facts) == decision
        assert inc.rung == decision.rung and inc.reason == decision.reason
