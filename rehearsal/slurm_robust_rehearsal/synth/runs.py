"""Synthetic run traces with known ground truth, for tests and for scale.

:func:`synth_run` simulates one run step by step: faults fire at known steps, each with
known detection, localization and restart delays and a known rollback, and the run writes
the same records the launcher writes (docs/SCHEMAS.md). Its :class:`Truth` holds the
figures the analysis must reproduce exactly (productive and wall time, ETTR, counts by
class and by rung, steps lost). :func:`write_run_dir` puts the records in a run directory.

The simulated run: ``run_start`` at ``start``; each attempt starts ``startup_s`` later
(after a fault: ``restart_s`` after localization, or after detection when the fault is
never localized); step ``s`` of an attempt finishes ``step_time_s`` after the previous
one (or after the attempt start); a fault after step ``k`` happens ``into_step_s`` into
the next step; the restart restores ``k - restore_back`` and redoes the rest.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_robust import records as rec
from slurm_robust.analysis.loaders import EVENTS_FILE, VERDICTS_FILE
from slurm_robust.analysis.taxonomy import CLASS_CATEGORY, read_class
from slurm_robust.vocabulary import RUNGS, Rung, RunStatus


@dataclass(frozen=True)
class Fault:
    """One injected fault: fires when step ``after_step`` has just finished."""

    after_step: int
    cls: str
    rung: str
    into_step_s: float = 0.5
    detect_s: float = 5.0
    localize_s: float | None = 2.0
    restart_s: float = 10.0
    restore_back: int = 0
    nodes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        cls, why = read_class(self.cls)
        if cls is None:
            raise ValueError(f"{why}; valid: {', '.join(CLASS_CATEGORY)}")
        object.__setattr__(self, "cls", cls)  # legacy names become their class
        if self.rung not in RUNGS:
            raise ValueError(f"unknown rung {self.rung!r}; expected one of {RUNGS}")
        if self.restore_back < 0 or self.into_step_s < 0 or self.detect_s < 0:
            raise ValueError("restore_back, into_step_s and detect_s must be >= 0")


@dataclass
class Truth:
    """What the analysis must find in the synthetic run."""

    wall_s: float
    productive_s: float
    steps_kept: int
    steps_redone: int
    incidents_by_class: Counter[str] = field(default_factory=Counter)
    incidents_by_rung: Counter[str] = field(default_factory=Counter)
    incidents: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s


@dataclass
class SynthRun:
    """Records of one simulated run and its ground truth."""

    run_id: str
    events: list[dict[str, Any]]
    verdicts: list[dict[str, Any]]
    truth: Truth


class _Sim:
    def __init__(self, run_id: str, job_id: str, start: float, step_time_s: float) -> None:
        self.run_id, self.job_id, self.dt = run_id, job_id, step_time_s
        self.t, self.attempt, self.events = start, 0, []  # type: list[dict[str, Any]]
        self.verdicts: list[dict[str, Any]] = []

    def emit(self, event: str, when: float, **fields: Any) -> dict[str, Any]:
        r = rec.make_record(rec.EVENT_SCHEMA, rec.EVENT_VERSION,
                            {"run_id": self.run_id, "job_id": self.job_id,
                             "attempt": self.attempt, "event": event, **fields}, now=when)
        self.events.append(r)
        return r

    def step(self, s: int) -> None:
        self.t += self.dt
        self.emit("step", self.t, step=s, step_time_s=self.dt, loss=1.0 / s, grad_norm=1.0,
                  rank=None)


def synth_run(run_id: str = "run0", steps: int = 20, step_time_s: float = 10.0,
              faults: list[Fault] | tuple[Fault, ...] = (), start: float = 1_700_000_000.0,
              startup_s: float = 5.0, job_id: str = "1000",
              nodes: tuple[str, ...] = ("node1", "node2")) -> SynthRun:
    """Simulate one run of ``steps`` steps with ``faults`` fired in order."""
    sim = _Sim(run_id, job_id, start, step_time_s)
    sim.emit("run_start", start, nodes=list(nodes), spares=[], world_size=len(nodes),
             layout={"tp": 1, "pp": 1, "dp": len(nodes)}, config={})
    sim.t = start + startup_s
    sim.emit("attempt_start", sim.t, nodes=list(nodes), restored_step=None, restore_tier=None)
    truth = Truth(wall_s=0.0, productive_s=0.0, steps_kept=0, steps_redone=0)
    done, status, kept = 0, RunStatus.COMPLETED, steps
    for i, f in enumerate(faults):
        if not done < f.after_step <= steps and not (f.after_step == done == 0):
            raise ValueError(f"fault {i} after step {f.after_step}: must be in "
                             f"({done}, {steps}] (steps done so far: {done})")
        while done < f.after_step:
            done += 1
            sim.step(done)
        stopped = _fire(sim, f, f"inc{i}", done, truth)
        if stopped:
            status, kept = RunStatus.STOPPED, done
            break
        done = f.after_step - f.restore_back
    if status == RunStatus.COMPLETED:
        while done < steps:
            done += 1
            sim.step(done)
    sim.emit("run_end", sim.t, status=status, step=kept, params_sha256="0" * 64, verdict="")
    truth.wall_s = sim.t - start
    truth.steps_kept = kept
    truth.productive_s = kept * step_time_s
    return SynthRun(run_id, sim.events, sim.verdicts, truth)


def _fire(sim: _Sim, f: Fault, inc_id: str, last: int, truth: Truth) -> bool:
    fault_time = sim.t + f.into_step_s
    detected = fault_time + f.detect_s
    localized = None if f.localize_s is None else detected + f.localize_s
    cat = CLASS_CATEGORY[f.cls]
    truth.incidents_by_class[f.cls] += 1
    truth.incidents_by_rung[f.rung] += 1
    base = {"incident": inc_id, "category": cat, "class": f.cls, "fault_time": fault_time,
            "detected_at": detected, "localized_at": localized, "rung": f.rung,
            "nodes": list(f.nodes), "ranks": [], "last_step": last,
            "restore_tier": None, "evidence": {"injected": True}}
    for node in f.nodes:
        if f.rung in (Rung.SPARE, Rung.REQUEUE):
            sim.verdicts.append(rec.make_record(
                rec.VERDICT_SCHEMA, rec.VERDICT_VERSION,
                {"job_id": sim.job_id, "node": node, "reason": f"{f.cls} injected",
                 "class": f.cls, "evidence": {}, "incident": inc_id}, now=detected))
    resume = (localized if localized is not None else detected) + f.restart_s
    if f.rung == "stop":
        sim.t = resume
        sim.emit("incident", resume, recovered_at=None, restored_step=None, steps_lost=0,
                 **base)
        truth.incidents.append({**base, "recovered_at": None, "steps_lost": 0})
        return True
    restored = last - f.restore_back
    sim.attempt += 1
    sim.t = resume
    sim.emit("attempt_start", resume, nodes=[], restored_step=restored, restore_tier="memory")
    recovered = resume + sim.dt
    truth.steps_redone += f.restore_back
    inc = {**base, "recovered_at": recovered, "restored_step": restored,
           "steps_lost": f.restore_back}
    truth.incidents.append(inc)
    # The incident record is written once recovered: after the first step that follows.
    sim.emit("incident", recovered, **inc)
    return False


def write_run_dir(path: str | os.PathLike[str], run: SynthRun) -> Path:
    """Write the run's events and verdicts as a run directory; returns its path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rec.append_records(path / EVENTS_FILE, run.events)
    if run.verdicts:
        rec.append_records(path / VERDICTS_FILE, run.verdicts)
    return path
