"""A synthetic fleet built directly as arrays (no JSON), for scale tests and the benchmark.

Every job is one run of ``steps_per_job`` steps; a share of jobs (``incident_rate``) has one
incident after a random step, with a random class, rung, delays and rollback, following
the same timeline as :func:`synth.synth_run`. Frames have the loaders' columns and dtypes,
except that string columns (job ids, node lists) are categoricals to keep a million jobs
small. :class:`FleetTruth` holds the exact expected figures.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from slurm_robust.analysis.frames import as_category
from slurm_robust.analysis.loaders import RunLog
from slurm_robust.analysis.pipeline import Inputs
from slurm_robust.analysis.slurm_text import JOB_STATES
from slurm_robust.analysis.taxonomy import CATEGORIES, CLASS_CATEGORY, CLASSES
from slurm_robust.vocabulary import HEALTH_STATUSES, RUN_STATUSES, RUNGS, Rung

BASE_TIME = 1_700_000_000.0
SPAN_S = 90 * 86400.0        # three months, as ByteRobust's 778,135 jobs
CLUSTER_NODES = 1000
STARTUP_S = 10.0
#: How often each rung ends a synthetic incident; a rung without a weight is never drawn,
#: so a rung added to the vocabulary needs nothing here.
RUNG_WEIGHTS = {Rung.IN_PLACE: 0.5, Rung.SPARE: 0.25, Rung.REQUEUE: 0.15, Rung.STOP: 0.1}
RUNG_P = tuple(RUNG_WEIGHTS.get(Rung(r), 0.0) for r in RUNGS)


@dataclass
class FleetTruth:
    """Exact figures the analysis must reproduce."""

    productive_s: float
    wall_s: float
    incidents: int
    steps_redone: int
    by_class: Counter[str]
    by_rung: Counter[str]


def _cat(codes: np.ndarray, categories: list[str] | pd.Index) -> pd.Categorical:
    return pd.Categorical.from_codes(codes.astype(np.int32), categories=categories)


def _ragged(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner index, 1-based position) for ``counts[i]`` rows per owner i."""
    owner = np.repeat(np.arange(len(counts)), counts)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return owner, np.arange(int(counts.sum())) - offsets + 1


def synth_fleet(n_jobs: int, steps_per_job: int = 8, incident_rate: float = 0.1,
                seed: int = 0) -> tuple[Inputs, FleetTruth]:
    """Build inputs for ``n_jobs`` jobs and their exact ground truth."""
    rng = np.random.default_rng(seed)
    n, S = n_jobs, steps_per_job
    run_cats = pd.Index([f"r{i}" for i in range(n)])
    dt = rng.uniform(5.0, 60.0, n)
    start = BASE_TIME + np.sort(rng.uniform(0.0, SPAN_S, n))
    a0 = start + STARTUP_S
    J = np.flatnonzero(rng.random(n) < incident_rate)
    m = len(J)
    k = rng.integers(1, S, m)
    cls = rng.integers(0, len(CLASSES), m)
    rung = rng.choice(len(RUNGS), m, p=RUNG_P)
    stop = rung == RUNGS.index(Rung.STOP)
    back = np.where(stop, 0, np.minimum(rng.integers(0, 3, m), k))
    fault = a0[J] + k * dt[J] + 0.5 * dt[J]
    det = fault + rng.uniform(1.0, 120.0, m)
    loc = det + rng.uniform(0.0, 60.0, m)
    resume = loc + np.where(rung == RUNGS.index(Rung.REQUEUE), rng.uniform(120, 900, m),
                            rng.uniform(10.0, 120.0, m))
    steps = _steps(n, S, J, k, back, stop, a0, resume, dt, run_cats)
    end = a0 + S * dt
    end[J] = np.where(stop, resume, resume + (S - k + back) * dt[J])
    nodes_of_job = rng.integers(1, 9, n)
    first_node = rng.integers(0, CLUSTER_NODES - 8, n)
    blamed = J[(np.array([CLASS_CATEGORY[CLASSES[c]] for c in cls]) == "explicit")
               & ((rung == RUNGS.index(Rung.SPARE)) | (rung == RUNGS.index(Rung.REQUEUE)))]
    blamed_mask = np.isin(J, blamed)
    node_names = [f"node{i}" for i in range(CLUSTER_NODES)]
    log = _runlog(n, run_cats, start, a0, J, stop, resume, k, back, end, steps, cls, rung,
                  fault, det, loc, first_node, blamed_mask, node_names, dt)
    inputs = Inputs(log=log, verdicts=_verdicts(det[blamed_mask], J[blamed_mask], first_node,
                                                run_cats, node_names),
                    health=_health(n, start, first_node, run_cats, node_names,
                                   J[blamed_mask], det[blamed_mask]),
                    node_events=_node_events(rng, det[blamed_mask], first_node[J[blamed_mask]],
                                             node_names),
                    sacct=_sacct(rng, n, start, end, nodes_of_job, first_node, J, rung,
                                 resume))
    truth = FleetTruth(
        productive_s=float((dt * S).sum() - (dt[J][stop] * (S - k[stop])).sum()),
        wall_s=float((end - start).sum()), incidents=m, steps_redone=int(back.sum()),
        by_class=Counter(CLASSES[c] for c in cls), by_rung=Counter(RUNGS[r] for r in rung))
    return inputs, truth


def _steps(n, S, J, k, back, stop, a0, resume, dt, run_cats) -> pd.DataFrame:
    # Attempt 0 runs S steps (or k when an incident strikes); attempt 1 redoes the rest
    # from the restored step k - back.
    c0 = np.full(n, S)
    c0[J] = k
    own0, i0 = _ragged(c0)
    own1, i1 = _ragged(np.where(stop, 0, S - k + back))
    job1 = J[own1]
    step_no = np.concatenate([i0, (k - back)[own1] + i1])
    step_job = np.concatenate([own0, job1])
    ns = len(step_no)
    return pd.DataFrame({
        "run_id": _cat(step_job, run_cats), "job_id": _cat(step_job, run_cats),
        "attempt": np.concatenate([np.zeros(len(i0), np.int64), np.ones(len(i1), np.int64)]),
        "time": np.concatenate([a0[own0] + i0 * dt[own0], resume[own1] + i1 * dt[job1]]),
        "step": step_no.astype(np.int64), "step_time_s": dt[step_job], "loss": 1.0 / step_no,
        "grad_norm": np.full(ns, np.nan),
        "rank": pd.arrays.IntegerArray(np.zeros(ns, np.int64), np.ones(ns, dtype=bool))})


def _runlog(n, run_cats, start, a0, J, stop, resume, k, back, end, steps, cls, rung,
            fault, det, loc, first_node, blamed_mask, node_names, dt) -> RunLog:
    m = len(J)
    codes = np.arange(n)
    runs = pd.DataFrame({"run_id": _cat(codes, run_cats), "job_id": _cat(codes, run_cats),
                         "attempt": np.zeros(n, np.int64), "time": start,
                         "world_size": pd.array(np.full(n, 8), dtype="Int64"),
                         "nodes": np.empty(n, dtype=object), "spares": np.empty(n, dtype=object)})
    again = J[~stop]
    att_codes = np.concatenate([codes, again])
    attempts = pd.DataFrame({
        "run_id": _cat(att_codes, run_cats), "job_id": _cat(att_codes, run_cats),
        "attempt": np.concatenate([np.zeros(n, np.int64), np.ones(len(again), np.int64)]),
        "time": np.concatenate([a0, resume[~stop]]),
        "restored_step": pd.array(np.concatenate([np.full(n, -1), (k - back)[~stop]]),
                                  dtype="Int64"),
        "restore_tier": as_category(pd.Series([None] * len(att_codes), dtype=object)),
        "nodes": np.empty(len(att_codes), dtype=object)})
    attempts.loc[: n - 1, "restored_step"] = pd.NA
    nodes_col = np.empty(m, dtype=object)
    for i in range(m):  # lists are per incident (10% of jobs), not per step
        nodes_col[i] = [node_names[first_node[J[i]]]] if blamed_mask[i] else []
    cls_names = np.array(CLASSES, dtype=object)[cls]
    cat_names = np.array([CLASS_CATEGORY[c] for c in CLASSES], dtype=object)[cls]
    recovered = np.where(stop, np.nan, resume + dt[J])
    incidents = pd.DataFrame({
        "run_id": _cat(J, run_cats), "job_id": _cat(J, run_cats),
        "attempt": np.where(stop, 0, 1).astype(np.int64),
        "time": np.where(stop, resume, recovered), "incident": pd.array(
            np.array(["i0"] * m, dtype=object), dtype="string"),
        "category": pd.Categorical(cat_names, categories=CATEGORIES),
        "class": pd.Categorical(cls_names, categories=CLASSES),
        "fault_time": fault, "detected_at": det, "localized_at": loc,
        "recovered_at": recovered,
        "rung": pd.Categorical.from_codes(rung, categories=RUNGS),
        "nodes": nodes_col, "ranks": np.empty(m, dtype=object),
        "last_step": pd.array(k, dtype="Int64"),
        "restored_step": pd.array(np.where(stop, 0, k - back), dtype="Int64"),
        "restore_tier": as_category(pd.Series([None] * m, dtype=object)),
        "steps_lost": pd.array(back, dtype="Int64"), "evidence": np.empty(m, dtype=object)})
    incidents.loc[stop, "restored_step"] = pd.NA
    ends = pd.DataFrame({"run_id": _cat(codes, run_cats), "job_id": _cat(codes, run_cats),
                         "attempt": np.zeros(n, np.int64), "time": end,
                         "status": pd.Categorical.from_codes(
                             np.isin(codes, J[stop]).astype(np.int8), categories=RUN_STATUSES),
                         "step": pd.array(np.full(n, 0), dtype="Int64")})
    return RunLog(runs=runs, attempts=attempts, steps=steps, incidents=incidents, ends=ends)


def _verdicts(det, jobs, first_node, run_cats, node_names) -> pd.DataFrame:
    return pd.DataFrame({"time": det, "job_id": _cat(jobs, run_cats),
                         "node": _cat(first_node[jobs], node_names),
                         "reason": pd.array([None] * len(jobs), dtype="string"),
                         "class": pd.Categorical([None] * len(jobs), categories=CLASSES),
                         "incident": pd.array([None] * len(jobs), dtype="string")})


def _health(n, start, first_node, run_cats, node_names, bad_jobs, bad_t) -> pd.DataFrame:
    jobs = np.concatenate([np.arange(n), bad_jobs])
    status = np.concatenate([np.zeros(n, np.int8), np.full(len(bad_jobs), 2, np.int8)])
    return pd.DataFrame({
        "time": np.concatenate([start, bad_t]), "node": _cat(first_node[jobs], node_names),
        "job": _cat(jobs, run_cats),
        "stage": pd.Categorical.from_codes(np.zeros(len(jobs), np.int8), categories=["prolog"]),
        "run_id": _cat(jobs, run_cats),
        "check": pd.Categorical.from_codes(np.zeros(len(jobs), np.int8), categories=["gpu_xid"]),
        "status": pd.Categorical.from_codes(status, categories=HEALTH_STATUSES),
        "duration_s": np.full(len(jobs), 0.01)})


def _node_events(rng, det, nodes, node_names) -> pd.DataFrame:
    e = len(det)
    return pd.DataFrame({
        "node": _cat(nodes, node_names), "start": det, "end": det + rng.uniform(600, 86400, e),
        "state": pd.Categorical.from_codes(np.zeros(e, np.int8), categories=["DRAIN"]),
        "kind": pd.Categorical.from_codes(np.zeros(e, np.int8),
                                          categories=["drain", "down", "fail", "other"]),
        "source": pd.Categorical.from_codes(np.zeros(e, np.int8), categories=["sacctmgr"])})


def _sacct(rng, n, start, end, nnodes, first_node, J, rung, resume) -> pd.DataFrame:
    requeued = J[rung == RUNGS.index(Rung.REQUEUE)]
    stopped = J[rung == RUNGS.index(Rung.STOP)]
    jobs = np.concatenate([np.arange(n), requeued])
    state = np.full(len(jobs), JOB_STATES.index("COMPLETED"), np.int8)
    state[stopped] = JOB_STATES.index("FAILED")
    state[n:] = JOB_STATES.index("REQUEUED")
    # A requeued job's first record runs until the requeue, its last one from there on.
    requeue_at = resume[rung == RUNGS.index(Rung.REQUEUE)]
    final_start = start.copy()
    final_start[requeued] = requeue_at
    rec_start = np.concatenate([final_start, start[requeued]])
    rec_end = np.concatenate([end, requeue_at])
    key = first_node * 10 + nnodes
    uniq, inverse = np.unique(key[jobs], return_inverse=True)
    lists = [f"node[{u // 10}-{u // 10 + u % 10 - 1}]" for u in uniq]
    ids = pd.Categorical.from_codes(jobs.astype(np.int32),
                                    categories=[str(i) for i in range(n)])
    return pd.DataFrame({
        "job_id": ids, "job_raw": ids, "name": ids,
        "partition": pd.Categorical.from_codes(np.zeros(len(jobs), np.int8), ["train"]),
        "state": pd.Categorical.from_codes(state, categories=JOB_STATES),
        "exit_code": pd.array(np.where(state == JOB_STATES.index("FAILED"), 1, 0),
                              dtype="Int64"),
        "signal": pd.array(np.zeros(len(jobs), np.int64), dtype="Int64"),
        "nnodes": pd.array(nnodes[jobs], dtype="Int64"),
        "node_list": pd.Categorical.from_codes(inverse.astype(np.int32), categories=lists),
        "submit": rec_start - rng.uniform(0, 600, len(jobs)), "start": rec_start,
        "end": rec_end, "elapsed_s": rec_end - rec_start})
