"""The parts of ``bench ettr`` every arm's run shares: the fault list, the schedule, the
sections, the targets and the analysis of the downtime (bench/ettr.py says what the
benchmark measures)."""

from __future__ import annotations

import math
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths

FAULTS = ("kill-worker", "nan", "kill-node", "stop-worker")
TARGET_ETTR = 0.98
#: With declared phases the steady-step hang limit is learned (seconds at 0.5 s steps),
#: not the single rule's floor: the target rises by what that saves.
TARGET_ETTR_PHASES = 0.99
TARGET_MINUTES, TARGET_FAULT_EVERY_S = 30.0, 300.0
#: The example's learning rate for a long run. Its default (3e-3) suits the short test
#: runs, whose cosine schedule has decayed by step 60; over a 30-minute schedule it stays
#: high and the training diverges at step 68 (grad norm 9-128x its median, the same
#: steps standalone), which the spike test rightly stops. The bench measures recovery,
#: so it trains a run that does not diverge.
LONG_RUN_LR = 1e-3


def parse_faults(text: str) -> list[str]:
    faults = [f.strip() for f in text.split(",") if f.strip()]
    bad = [f for f in faults if f not in FAULTS]
    if not faults or bad:
        raise UsageError(f"--faults: unknown {bad or 'empty list'}; choose from "
                         f"{','.join(FAULTS)}")
    return faults


def parse_sections(items: list[str]) -> list[str]:
    """``--section`` values, checked as the example checks them (NAME:EVERY:SECONDS)."""
    for item in items:
        name, every, seconds = (item.split(":") + ["", ""])[:3]
        try:
            ok = bool(name) and int(every) > 0 and float(seconds) >= 0 and \
                item.count(":") == 2
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"--section {item!r}: use NAME:EVERY:SECONDS, e.g. eval:200:5")
    return list(items)


def section_s_per_step(sections: list[str]) -> float:
    """The sections' seconds per step on average (checked ``NAME:EVERY:SECONDS`` values):
    productive time, which the robust run counts inside its steps."""
    return sum(float(item.split(":")[2]) / int(item.split(":")[1]) for item in sections)


def planned_steps(minutes: float, step_time: float, sections: list[str]) -> int:
    """Steps that fill ``minutes`` without faults, the sections' time included."""
    return max(10, math.ceil(minutes * 60 / (step_time + section_s_per_step(sections))))


def section_args(sections: list[str]) -> list[str]:
    return [a for item in sections for a in ("--section", item)]


def schedule(start: float, minutes: float, every_s: float, faults: list[str],
             ) -> list[tuple[float, str]]:
    """(time, fault) for each fault: every ``every_s`` after ``start``, not in the last
    ``every_s / 2`` of the run (a fault there would have no time to recover in)."""
    end = start + minutes * 60
    out, k = [], 1
    while start + k * every_s <= end - every_s / 2:
        out.append((start + k * every_s, faults[(k - 1) % len(faults)]))
        k += 1
    return out


def downtime_split(incidents: Any) -> dict[str, float]:
    """Seconds of detect, localise, recover and redo summed over the incidents."""
    def total(series: Any) -> float:
        return float(series.clip(lower=0).sum()) if len(series) else 0.0

    recover = incidents["recovered_at"] - incidents["localized_at"].fillna(
        incidents["detected_at"])
    return {"detect_s": round(total(incidents["time_to_detect"]), 2),
            "localise_s": round(total(incidents["time_to_localize"]), 2),
            "recover_s": round(total(recover), 2),
            "redo_s": round(total(incidents["lost_work_s"]), 2)}


def phase_figures(run_dir: Any, incidents: Any) -> dict[str, Any]:
    """The run's learned hang limits (state.json) and, per hang incident, the limit it
    was declared under (its evidence) and the time from the fault to the declaration."""
    state = load_state(RunPaths.of(run_dir).state)
    hangs = []
    if len(incidents) and "class" in incidents:
        for inc in incidents[incidents["class"] == "job_hang"].to_dict("records"):
            evidence = inc.get("evidence")
            limit = evidence.get("hang_limit") if isinstance(evidence, dict) else None
            detect = inc.get("time_to_detect")
            hangs.append({"hang_limit": limit,
                          "time_to_detect_s": round(float(detect), 2)
                          if isinstance(detect, float) and math.isfinite(detect) else None})
    return {"declared": bool(state.declares_phases),
            "limits_s": dict(state.hang_limits) if state.declares_phases else {},
            "hangs": hangs}
