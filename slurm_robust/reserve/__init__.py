"""The warm reserve: deep-checked idle nodes in the ``standby`` partition, handed to jobs.

Public API::

    from slurm_robust.reserve import (binomial_quantile, reserve_config, reconcile, status,
                                      handle_job_end, write_verdict, repeat_offender_reason)

- Sizing (pure, ``sizing.py``): ``binomial_quantile(n, p, q)`` is the smallest k with
  P(X <= k) >= q for X ~ Binomial(n, p); with p = 0.0012 it gives ByteRobust's table
  (2 spares for 128 and 256 nodes, 3 for 512, 4 for 1,024). ``estimate_failure_prob``
  blends failures counted in Slurm's node events with the configured prior.
- Config (``config.py``): ``reserve_config(site)`` validates the site config's ``reserve``
  section into a frozen :class:`ReserveConfig` (unknown keys list the valid ones).
- Planning (pure, ``plan.py``): ``plan_reconcile(snapshot, cfg, target, checked)`` and
  ``plan_handoff(...)`` return actions (Move, DeepCheck, Drain, Note); ``executor.py``
  applies them through ``slurm_robust.slurm`` and logs each one.
- ``reconcile(slurm, gate, cfg)`` fills the reserve to its target from idle nodes of the
  train partitions that pass the deep suite and returns surplus or unfit members home;
  idempotent, serialised by an ``fcntl`` lock (``lock.py``). ``status(...)`` reports it.
- Handoff (``handoff.py``, run by ``epilog/epilog_slurmctld.py``): ``handle_job_end``
  reads the job's verdicts (``verdicts.py``: spool ``<verdict_dir>/<user>/<job>.jsonl``,
  validated as hostile input), drains only nodes of that job, and, if the job was
  requeued, moves as many spares into its partition as it lost.
- Jobs write verdicts with ``write_verdict(verdict_root, user, job_id, node, reason,
  cls, evidence, incident, run_dir)``; ``reserve_config(site).verdict_root`` says where.
- Repeat offenders (pure, ``history.py``): ``repeat_offender_reason(node, history, now,
  window_s, new_reason)`` gives the drain reason for a node that fails again soon after
  being returned to service (history from ``events_from_sacctmgr``), or None.
- Health (``gate.py``): :class:`HealthGate` is the injection point to the health feature
  (``last_deep_pass``, ``run_suite``); :class:`LocalSuiteGate` runs the deep suite only for
  nodes whose address is this host, and says so for any other.
- Checks on the node (``remote_check.py``): :class:`SlurmNodeGate`, what ``reserve
  reconcile`` uses, and ``node resume`` ask the node's own slurmd to deep-check it (a
  "pending deep check" drain answered by the HealthCheckProgram) and wait with a budget.
"""

from slurm_robust.reserve.config import ReserveConfig, reserve_config
from slurm_robust.reserve.gate import DeepRun, HealthGate, LocalSuiteGate
from slurm_robust.reserve.handoff import (
    HandoffReport,
    JobEnd,
    handle_job_end,
    is_requeued,
    job_end_from_env,
    start_when_requeued,
)
from slurm_robust.reserve.history import (
    NodeEvent,
    events_from_health,
    events_from_sacctmgr,
    failure_times,
    repeat_offender_reason,
)
from slurm_robust.reserve.lock import ReserveLockTimeout, reserve_lock
from slurm_robust.reserve.plan import (
    DeepCheck,
    Drain,
    Move,
    NodeView,
    Note,
    Snapshot,
    plan_handoff,
    plan_reconcile,
)
from slurm_robust.reserve.reconcile import ReconcileReport, reconcile, status, take_snapshot
from slurm_robust.reserve.sizing import (
    binomial_cdf,
    binomial_quantile,
    estimate_failure_prob,
    reserve_target,
)
from slurm_robust.reserve.verdicts import (
    Verdict,
    VerdictError,
    ensure_verdict_root,
    read_job_verdicts,
    verdict_path,
    write_verdict,
)

__all__ = [
    "DeepCheck", "DeepRun", "Drain", "HandoffReport", "HealthGate", "JobEnd",
    "LocalSuiteGate", "Move", "NodeEvent", "NodeView", "Note", "ReconcileReport",
    "ReserveConfig", "ReserveLockTimeout", "Snapshot", "Verdict", "VerdictError",
    "binomial_cdf", "binomial_quantile", "ensure_verdict_root", "estimate_failure_prob",
    "events_from_health", "events_from_sacctmgr", "failure_times", "handle_job_end",
    "is_requeued", "job_end_from_env", "plan_handoff", "plan_reconcile", "read_job_verdicts",
    "reconcile", "repeat_offender_reason", "reserve_config", "reserve_lock", "reserve_target",
    "start_when_requeued", "status", "take_snapshot", "verdict_path", "write_verdict",
]
