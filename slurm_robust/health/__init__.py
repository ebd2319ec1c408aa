"""Node self-checks: one check contract, quick and deep suites, a health journal.

Public API (what the prolog, the epilog, the CLI and the reserve use)::

    from slurm_robust.health import run_suite, last_deep_pass

    result = run_suite("epilog", node="node2", job="123")   # runs, journals, returns
    result.passed      # True when no check failed (warn and skip pass)
    result.failures    # list[CheckResult] with status "fail", in run order
    result.reason      # "slurm_robust: gpu_xid: Xid 79 on GPU 3, expected no critical Xid"
                       # (first failure; "" when passed)
    result.results     # every CheckResult (check, status, reason, evidence, duration_s, injected)
    last_deep_pass("node2")  # Unix time of the newest passing deep-suite run, or None

``run_suite(stage, node, job=None, config=None, probes=None, journal=True)``:

- ``stage`` is what is recorded in the journal and picks the suite: ``prolog`` runs the
  quick suite; ``epilog``, ``reserve`` and ``resume`` run the deep suite (every check);
  ``manual`` runs the suite named by ``suite=`` (``quick`` or ``deep``, default ``deep``).
- ``config`` is a :class:`~slurm_robust.site_config.SiteConfig` (default: loaded from
  ``$SLURM_ROBUST_CONFIG``). ``config.checks`` holds per-check parameters,
  ``{check: {param: value}}``; an unknown check or parameter raises ``UsageError`` listing
  the valid ones. Every check takes ``enabled`` (bool) and ``budget_s`` (float).
- ``probes`` is a :class:`Probes`: the ONE layer through which every hardware and OS reading
  passes (NVML, disk, memory, processes, mounts). By default it reads the node's injection
  file ``<state_dir>/inject.json`` (written by ``slurm-robust inject probe``) and returns an
  injected value where one is set; tests pass ``Probes(injected={...})``.
- Exactly one journal append per run (``<state_dir>/health/<node>.jsonl``, schema
  ``slurm_robust.health`` v1 in docs/SCHEMAS.md) unless ``journal=False``.

A check is a function registered with :func:`check`; it gets a :class:`CheckContext`
(``probes``, ``node``, ``job``, ``stage``, ``config``) and its validated parameters and
returns an :class:`Outcome` built with :func:`ok`, :func:`warn`, :func:`fail` or
:func:`skip`, with numbers as evidence. A site adds its own checks by listing importable
modules in ``checks.site_modules`` of the site config. See ``slurm_robust.health.checks``.

Draining: :func:`drain_for_failure` never overwrites an admin's reason and prefixes ours
with ``slurm_robust:`` (see drain.py).
"""

from slurm_robust.health.drain import (
    PENDING_PREFIX,
    DrainDecision,
    ReasonKind,
    decide_drain,
    drain_for_failure,
    drain_reason,
)
from slurm_robust.health.errors import NoNVMLError
from slurm_robust.health.framework import (
    CheckContext,
    CheckResult,
    Outcome,
    Status,
    check,
    fail,
    ok,
    registered_checks,
    skip,
    warn,
)
from slurm_robust.health.journal import journal_path, last_deep_pass, read_journal
from slurm_robust.health.probes import Probes
from slurm_robust.health.suite import STAGES, SUITES, SuiteResult, run_suite

__all__ = [
    "STAGES", "SUITES", "CheckContext", "CheckResult", "DrainDecision", "NoNVMLError",
    "Outcome", "Probes", "Status", "SuiteResult", "check", "decide_drain",
    "drain_for_failure", "drain_reason", "PENDING_PREFIX", "ReasonKind", "fail",
    "journal_path", "last_deep_pass", "ok", "read_journal",
    "registered_checks", "run_suite", "skip", "warn",
]
