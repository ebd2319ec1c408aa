"""Each Slurm allocation of a run, and what each boundary between two of them cost.

A run longer than its time limit, preempted, or requeued is a chain of allocations; the
launcher numbers them (``attempt``, the job's requeue count) and starts each with an
``attempt_start`` record. The boundary between allocation k and k+1 is explained by the
incidents logged in k+1 with the ``requeue`` rung (``time_limit``, ``node_lost``, ...;
``admin`` and ``preempted`` for requeues Slurm made without the launcher, which the next
allocation records from accounting: launcher/control/external_requeue.py); ``requeue``
alone when none was logged (event logs written before that record existed). The last
allocation ends with the run's ``run_end`` status, or ``running`` without one.

Columns: ``run_id``, ``attempt``, ``job_id``, ``started_at`` (its ``attempt_start``),
``nodes``, ``restored_step``, ``restore_tier``, ``to_first_step_s`` (start to its first
step record: start-up and restore), ``steps`` (step records), ``last_step``, ``ended_by``,
``boundary_s`` (its last step record to the next allocation's first: the wall time the
boundary cost, queue wait included), ``steps_redone`` (its last step minus the next
allocation's restored step; all of them when the next one started from scratch).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from slurm_robust.analysis.loaders import RunLog

COLUMNS = ["run_id", "attempt", "job_id", "started_at", "nodes", "restored_step",
           "restore_tier", "to_first_step_s", "steps", "last_step", "ended_by",
           "boundary_s", "steps_redone"]
REQUEUE = "requeue"


def allocation_table(log: RunLog) -> pd.DataFrame:
    """One row per allocation of every run (module doc); empty frame without attempts."""
    att = log.attempts
    if att.empty:
        return pd.DataFrame(columns=COLUMNS)
    key = ["run_id", "attempt"]
    base = (att.assign(run_id=att["run_id"].astype(str))
            .sort_values(["run_id", "attempt", "time"])
            .drop_duplicates(key, keep="first"))
    out = pd.DataFrame({
        "run_id": base["run_id"].to_numpy(), "attempt": base["attempt"].to_numpy(),
        "job_id": base["job_id"].to_numpy(), "started_at": base["time"].to_numpy(),
        "nodes": [len(n) if isinstance(n, list) else np.nan for n in base["nodes"]],
        "restored_step": base["restored_step"].to_numpy(),
        "restore_tier": base["restore_tier"].astype(object).to_numpy()})
    steps = log.steps.assign(run_id=log.steps["run_id"].astype(str))
    per = steps.groupby(key, observed=True).agg(first_step_at=("time", "min"),
                                                last_step_at=("time", "max"),
                                                steps=("step", "size"),
                                                last_step=("step", "max")).reset_index()
    out = out.merge(per, on=key, how="left")
    out["steps"] = out["steps"].fillna(0).astype(np.int64)
    out["to_first_step_s"] = out["first_step_at"] - out["started_at"]

    nxt = out.groupby("run_id", sort=False).shift(-1)
    has_next = nxt["attempt"].notna().to_numpy()
    out["boundary_s"] = np.where(has_next, nxt["first_step_at"] - out["last_step_at"], np.nan)
    redone = out["last_step"] - nxt["restored_step"].astype(np.float64).fillna(0.0)
    out["steps_redone"] = np.where(has_next, redone, np.nan)
    out["ended_by"] = _causes(log, out, has_next)
    return out[COLUMNS].reset_index(drop=True)


def _causes(log: RunLog, out: pd.DataFrame, has_next: np.ndarray) -> list[str]:
    inc = log.incidents
    requeues = inc[inc["rung"].astype(object) == REQUEUE]
    by_attempt: dict[tuple[str, int], list[str]] = {}
    for run, attempt, cls in zip(requeues["run_id"].astype(str), requeues["attempt"],
                                 requeues["class"].astype(object), strict=True):
        seen = by_attempt.setdefault((run, int(attempt)), [])
        if cls not in seen:
            seen.append(str(cls))
    ends = {(str(r), int(a)): str(s) for r, a, s in
            zip(log.ends["run_id"], log.ends["attempt"], log.ends["status"].astype(object),
                strict=True)}
    last_end = {r: s for (r, _a), s in sorted(ends.items())}
    causes = []
    for run, attempt, more in zip(out["run_id"], out["attempt"], has_next, strict=True):
        if more:
            causes.append(",".join(by_attempt.get((run, int(attempt) + 1), [REQUEUE])))
        else:
            causes.append(ends.get((run, int(attempt)), last_end.get(run, "running")))
    return causes


def boundary_summary(table: pd.DataFrame) -> dict[str, float | int]:
    """Allocations, boundaries, and the wall time and steps they cost in all."""
    crossed = table[table["boundary_s"].notna()]
    return {"allocations": int(len(table)), "boundaries": int(len(crossed)),
            "boundary_h": float(crossed["boundary_s"].sum() / 3600),
            "steps_redone_at_boundaries": int(crossed["steps_redone"].fillna(0).sum())}
