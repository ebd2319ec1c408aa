"""Hang limits per phase, end to end through the recovery owner on a fake clock.

The detector reads time only through ``Recovery.tick(now)``: these tests advance a fake
clock, feed the progress lines a worker writes (steps, ``phase`` lines), and look at
whether the run went to DUMPING (a hang's stack capture). Nothing sleeps.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from slurm_robust import train
from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import phases
from slurm_robust.launcher.control.generation import Generation
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.enums import Phase, WorkPhase
from slurm_robust.launcher.messages import BadMessage, Progress
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.submit.status import format_status
from tests.unit.launcher.control.test_recovery_owner import Harness

#: The launcher's defaults, not the fast ones of the owner tests' harness.
DEFAULTS: dict[str, Any] = {"hang_floor_s": RunConfig.hang_floor_s,
                            "startup_timeout_s": RunConfig.startup_timeout_s}


class Worker:
    """Two ranks' progress lines into a harness, the clock advanced in ticks."""

    def __init__(self, h: Harness, tick_s: float = 0.1) -> None:
        self.h, self.tick_s = h, tick_s

    def lines(self, item: dict[str, Any]) -> None:
        for m in self.h.slot_members():
            for r in self.h.rec.ranks_of(m.index):
                self.h.report(m, [{**item, "rank": r, "t": self.h.clock()}])

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` pass, ticking; the run must stay RUNNING throughout."""
        for _ in range(round(seconds / self.tick_s)):
            self.h.tick(self.tick_s)
            assert self.h.rec.phase is Phase.RUNNING, \
                f"hang declared at step {self.h.step}: {self.h.rec.gen.hang_limit}"

    def steps(self, n: int, step_s: float = 0.5) -> None:
        for _ in range(n):
            self.wait(step_s)
            self.h.step += 1
            self.lines({"kind": "step", "step": self.h.step, "loss": 1.0})
            self.h.tick(0.0)

    def section(self, name: str, seconds: float) -> None:
        phase = train.NAMED_PHASES.get(name, WorkPhase.SECTION)
        self.lines({"kind": "phase", "phase": phase.value, "section": name})
        self.wait(seconds)
        self.lines({"kind": "phase", "phase": "steps"})

    def time_to_hang(self, limit_s: float) -> float:
        """Seconds of silence until the run declares a hang (fails past ``limit_s``)."""
        start = self.h.clock()
        while self.h.rec.phase is Phase.RUNNING:
            self.h.tick(self.tick_s)
            assert self.h.clock() - start <= limit_s, "no hang declared in time"
        assert self.h.rec.phase is Phase.DUMPING
        return self.h.clock() - start


def started(tmp_path: Any, **kw: Any) -> tuple[Harness, Worker]:
    h = Harness(tmp_path, **{**DEFAULTS, **kw})
    h.tick()
    assert h.rec.phase is Phase.RUNNING
    h.restored(None)
    return h, Worker(h)


# ------------------------------------------------------------------ the three promises
def test_eval_and_save_sections_at_their_cadence_raise_nothing(tmp_path):
    # 60 s evaluation every 200 steps, 30 s save every 500, half-second steps.
    h, w = started(tmp_path)
    for _ in range(1000):
        w.steps(1)
        if h.step % 200 == 0:
            w.section("eval", 60.0)
        if h.step % 500 == 0:
            w.section("save", 30.0)
    assert h.step == 1000 and h.incidents() == []
    times = h.rec.state.phase_times
    assert times["eval"] and all(59.0 <= d <= 61.0 for d in times["eval"])
    assert times["save"] and all(29.0 <= d <= 31.0 for d in times["save"])
    # The steps after a section are no step times: the learned step stays half a second.
    assert max(times["steps"]) < 1.0


def test_a_first_step_of_120_s_raises_nothing_with_default_settings(tmp_path):
    h, w = started(tmp_path)
    # Even where this run already timed quick start-ups (an in-place restart's):
    # learning only raises the start-up limit.
    h.rec.state.declares_phases = True
    h.rec.state.phase_times["startup"] = [5.0] * 10
    w.wait(120.0)
    w.steps(3)
    assert h.incidents() == [] and h.rec.phase is Phase.RUNNING


def test_a_worker_stopped_in_steady_state_is_hung_within_5_s(tmp_path):
    h, w = started(tmp_path)
    w.section("warmup", 2.0)  # any declared phase opts the run in
    w.steps(60)
    took = w.time_to_hang(5.0)
    assert took <= 5.0
    assert h.rec.gen.hang_limit == {"phase": "steps", "limit_s": 3.0}


# ------------------------------------------------------------------ around the rules
def test_a_run_that_declares_no_phase_keeps_the_single_rule(tmp_path):
    h, w = started(tmp_path)
    w.steps(60)
    took = w.time_to_hang(30.0)
    assert 20.0 <= took <= 21.0  # max(hang floor 20 s, 10 x 0.5 s)
    assert h.rec.gen.hang_limit is None


def test_a_script_that_never_steps_is_judged_by_its_sections_only(tmp_path):
    h, w = started(tmp_path)
    w.section("load", 5.0)  # declares phases, but no step ever
    w.wait(3600.0)  # longer than every limit: still no hang outside a section
    w.lines({"kind": "phase", "phase": "section", "section": "load"})
    assert 29.9 <= w.time_to_hang(40.0) <= 30.2  # max(30 s floor, 3 x 5 s)


def test_a_worker_stopped_inside_a_section_gets_that_section_s_limit(tmp_path):
    h, w = started(tmp_path)
    w.steps(10)
    w.section("eval", 60.0)  # learned: 3 x 60 s
    w.steps(10)
    w.lines({"kind": "phase", "phase": "eval", "section": "eval"})
    took = w.time_to_hang(200.0)
    assert 180.0 <= took <= 181.0
    assert h.rec.gen.hang_limit == {"phase": "eval", "limit_s": 180.0}


def test_one_rank_saving_holds_the_group_to_the_save_limit(tmp_path):
    h, w = started(tmp_path)
    w.steps(10)
    w.section("save", 30.0)  # learned: max(30 s floor, 3 x 30 s) = 90 s
    w.steps(10)
    m = h.slot_members()[0]
    h.report(m, [{"kind": "phase", "phase": "save", "rank": h.rec.ranks_of(m.index)[0],
                  "t": h.clock()}])
    w.wait(80.0)  # the other rank waits at the next collective: not hung
    took = w.time_to_hang(20.0)
    assert took <= 11.0 and h.rec.gen.hang_limit["phase"] == "save"


def test_an_explicit_limit_replaces_the_learned_one(tmp_path):
    h, w = started(tmp_path, hang_limits={"steps": 8.0, "section": 5.0})
    w.section("tokenize", 4.0)
    w.steps(20)
    assert 8.0 <= w.time_to_hang(9.0) <= 8.1


def test_learned_durations_survive_a_restart_of_the_controller(tmp_path):
    h, w = started(tmp_path)
    w.steps(10)
    w.section("eval", 60.0)
    w.steps(10)
    h.rec.persist()
    saved = load_state(RunPaths.of(h.cfg.run_dir).state)
    assert saved.declares_phases and saved.phase_times["eval"] == [60.0]
    assert saved.hang_limits["eval"] == 180.0 and saved.hang_limits["startup"] == 1800.0
    again = Harness(tmp_path, **DEFAULTS)  # a requeue's controller reads state.json
    assert again.rec.state.phase_times == saved.phase_times
    assert again.rec.state.declares_phases


# ------------------------------------------------------------------ pure parts
def test_limits_per_phase():
    book = {"steps": [0.5] * 10 + [0.7], "eval": [60.0, 62.0], "save": [2.0]}
    assert phases.limit_of("steps", book, {}, 1800.0) == 3.5  # 5 x p95
    assert phases.limit_of("eval", book, {}, 1800.0) == 186.0
    assert phases.limit_of("save", book, {}, 1800.0) == 30.0  # the floor
    assert phases.limit_of("section:x", book, {}, 1800.0) == 1800.0  # never timed
    assert phases.limit_of("startup", {"startup": [900.0]}, {}, 1800.0) == 2700.0
    assert phases.limit_of("finishing", book, {}, 1800.0) == 300.0
    assert phases.limit_of("section:x", book, {"section": 9.0}, 1800.0) == 9.0
    assert phases.limit_of("section:x", book, {"section:x": 7.0, "section": 9.0},
                           1800.0) == 7.0


def test_one_slow_step_in_a_short_history_does_not_stretch_the_step_limit():
    """Seen on the mini-cluster: when a worker stopped, 17 step times of about 0.5 s were
    known, one of them 3.108 s; the p95 of so few is the slowest, the limit was 15.54 s."""
    steps = [0.624, 0.474, 0.658, 0.361, 0.827, 3.108, 0.311, 0.351, 0.54, 0.487, 0.727,
             0.296, 0.488, 0.576, 0.425, 0.518, 0.516]
    assert phases.quantile(steps) == 3.108
    limit = phases.limit_of("steps", {"steps": steps}, {}, 1800.0)
    assert limit == 5 * 3 * 0.516  # 5 x (3 x the median), not 5 x 3.108
    # A run whose steps are all slow is judged by its own pace.
    assert phases.limit_of("steps", {"steps": [2.0] * 10 + [2.5] * 2}, {}, 1800.0) == 12.5


def test_the_step_limit_waits_for_a_warm_group():
    gen = Generation(number=1, attempt=0, slots=[0], started_at=0.0, steps_done=2)
    book = {"steps": [0.5] * 10}
    # Two steps into a restarted group: today's rule, whatever the book says.
    assert phases.steps_limit(gen, book, {}, [0.5] * 10, 20.0, 10.0) == 20.0
    gen.steps_done = phases.STEPS_WARMUP
    assert phases.steps_limit(gen, book, {}, [0.5] * 10, 20.0, 10.0) == 3.0


def test_observations_are_bounded():
    book: dict[str, list[float]] = {}
    for i in range(phases.KEEP_PHASES + 5):
        phases.observe(book, f"section:s{i}", 1.0)
    for _ in range(phases.KEEP_PER_PHASE + 5):
        phases.observe(book, "eval", 1.0)
    assert len(book) == phases.KEEP_PHASES and "eval" in book
    assert len(book["eval"]) == phases.KEEP_PER_PHASE
    phases.observe(book, "eval", float("nan"))
    assert len(book["eval"]) == phases.KEEP_PER_PHASE


def test_hang_limit_option_parsing():
    assert phases.parse_overrides(["eval=600", "section:tok=30", "steps=2.5"]) == \
        {"eval": 600.0, "section:tok": 30.0, "steps": 2.5}
    for bad in ("eval", "nope=3", "eval=-1", "eval=inf", "section:=4", "save=x"):
        with pytest.raises(ValueError, match="--hang-limit"):
            phases.parse_overrides([bad])
    with pytest.raises(UsageError, match="hang limit"):
        RunConfig(command=("x",), run_dir="/tmp/r", hang_limits={"bogus": 3.0})
    with pytest.raises(UsageError, match="seconds > 0"):
        RunConfig(command=("x",), run_dir="/tmp/r", hang_limits={"eval": 0})


def test_progress_phase_is_typed_and_missing_means_steps():
    assert Progress.from_json({"rank": 0, "step": 4}).phase is None
    assert phases.phase_key(None, None) == "steps"
    item = Progress.from_json({"rank": 1, "kind": "phase", "phase": "section",
                               "section": "tokenize"})
    assert phases.phase_key(item.phase, item.section) == "section:tokenize"
    assert item.to_json() == {"rank": 1, "kind": "phase", "phase": "section",
                              "section": "tokenize"}
    with pytest.raises(BadMessage):
        Progress.from_json({"rank": 0, "kind": "phase", "phase": "lunch"})
    with pytest.raises(BadMessage):
        Progress.from_json({"rank": 0, "kind": "phase", "phase": "section",
                            "section": "x" * 65})


def test_run_section_reports_phases_and_nests(tmp_path):
    path = tmp_path / "progress"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    run = train.RobustRun(rank=0, local_rank=0, world_size=1, node="n", attempt=0,
                          job_id="1", run_dir=None, backend="gloo", _progress_fd=fd)
    run.last_step = 7
    with run.section("eval"):
        with run.section("tokenize"):
            assert run.current_phase is WorkPhase.SECTION
        assert run.current_phase is WorkPhase.EVAL
    assert run.current_phase is WorkPhase.STEPS
    with pytest.raises(ValueError, match="run.section"):
        with run.section(""):
            pass
    os.close(fd)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["phase"], x.get("section")) for x in lines] == [
        ("eval", None), ("section", "tokenize"), ("eval", None), ("steps", None)]
    assert all(x["kind"] == "phase" and x["step"] == 7 for x in lines)
    for x in lines:  # what the agent checks before relaying
        Progress.from_json({**x, "rank": 0})


def test_status_shows_the_limits_of_a_run_that_declares_phases():
    base: dict[str, Any] = {"run_id": "r", "job_id": "1", "status": "running", "step": 3,
                            "loss": 1.0, "attempt": 0, "restarts": 0, "nodes": ["n1"],
                            "run_dir": "/r", "incidents": [], "verdicts": []}
    text = format_status({**base, "hang_limits": {"startup": 1800.0, "steps": 3.0,
                                                  "eval": 180.0}})  # type: ignore[typeddict-item]
    assert "hang limits: startup 1800 s, steps 3 s, eval 180 s" in text
    assert "hang limits" not in format_status({**base, "hang_limits": {}})  # type: ignore[typeddict-item]
