"""Run a suite of checks on one node, journal the results, return a SuiteResult."""

from __future__ import annotations

import importlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health import checks as _builtin  # noqa: F401 - registers the built-ins
from slurm_robust.health.framework import (
    DEEP,
    QUICK,
    Check,
    CheckContext,
    CheckResult,
    Status,
    registered_checks,
    run_check,
)
from slurm_robust.health.journal import journal_path, make_records, write_run
from slurm_robust.health.node_verdict import document, document_path, write_document
from slurm_robust.health.probes import Probes
from slurm_robust.site_config import SiteConfig, load_site_config

STAGES = ("prolog", "epilog", "manual", "reserve", "resume")
log = logging.getLogger("slurm_robust.health")

SUITES = (QUICK, DEEP)
STAGE_SUITE = {"prolog": QUICK, "epilog": DEEP, "reserve": DEEP, "resume": DEEP}
# Keys of the site config's "checks" object that are not check names.
SITE_MODULES_KEY = "site_modules"
SUITE_BUDGET_KEY = "suite_budget_s"
DEFAULT_SUITE_BUDGET_S = {QUICK: 10.0, DEEP: 60.0}


def failure_reason(prefix: str, failures: list[CheckResult]) -> str:
    """One line naming the first failing check and its evidence, "" when none failed:
    the drain reason of a suite, the verdict line of a stop-time diagnosis."""
    if not failures:
        return ""
    more = f" (+{len(failures) - 1} more failed)" if len(failures) > 1 else ""
    return f"{prefix}: {failures[0].reason}{more}"


@dataclass(frozen=True)
class SuiteResult:
    """The results of one suite run on one node."""

    node: str
    job: str | None
    stage: str
    suite: str
    run_id: str
    results: list[CheckResult]
    journal: Path | None
    #: The run's verdict document (health/node_verdict.py), also written beside the
    #: journal when the run is journaled.
    verdict: dict[str, Any] | None = None

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL]

    @property
    def errors(self) -> list[CheckResult]:
        """Checks whose program raised: reported and counted, never a drain reason."""
        return [r for r in self.results if r.status is Status.ERROR]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def undecided(self) -> list[CheckResult]:
        """Fail-closed checks that could not run: they keep a node from being admitted
        (a return to service, the reserve), never drain one in service."""
        return [r for r in self.results if r.blocks_admission]

    @property
    def admits(self) -> bool:
        """Whether a node may be admitted on this run: passed, and every fail-closed
        check could run."""
        return self.passed and not self.undecided

    @property
    def admission_reason(self) -> str:
        """Why the node is not admitted: the first failure, else the first fail-closed
        check that could not run; "" when admitted."""
        if self.failures:
            return self.reason
        if not self.undecided:
            return ""
        first = self.undecided[0]
        more = f" (+{len(self.undecided) - 1} more)" if len(self.undecided) > 1 else ""
        return (f"slurm_robust: {first.check}: could not run, fail-closed: "
                f"{first.reason[len(first.check) + 2:]}{more}")

    @property
    def reason(self) -> str:
        """Drain reason naming the first failing check and its evidence; "" if passed."""
        return failure_reason("slurm_robust", self.failures)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "job": self.job, "stage": self.stage, "suite": self.suite,
                "run_id": self.run_id, "passed": self.passed, "reason": self.reason,
                "check_errors": len(self.errors), "admits": self.admits,
                "journal": str(self.journal) if self.journal else None,
                "severity": self.verdict["severity"] if self.verdict else None,
                "results": [{"check": r.check, "status": r.status.value, "reason": r.reason,
                             "duration_s": r.duration_s, "injected": r.injected,
                             "on_error": r.on_error, "evidence": r.evidence}
                            for r in self.results]}


def plan_suite(suite: str, config: SiteConfig) -> tuple[list[tuple[Check, dict[str, Any]]],
                                                        float]:
    """Checks of a suite with validated parameters, and the suite's total budget.

    Raises UsageError for an unknown check, parameter or suite (listing the valid ones).
    """
    if suite not in SUITES and suite != "all":
        raise UsageError(f"unknown suite {suite!r}; valid: {', '.join(SUITES)}, all")
    section = dict(config.checks)
    for mod in section.pop(SITE_MODULES_KEY, []):
        importlib.import_module(mod)  # a site's own checks register themselves on import
    budgets = dict(DEFAULT_SUITE_BUDGET_S)
    raw_budget = section.pop(SUITE_BUDGET_KEY, {})
    if not isinstance(raw_budget, dict) or set(raw_budget) - set(SUITES):
        raise UsageError(f"checks.{SUITE_BUDGET_KEY} must map quick/deep to seconds, "
                         f"got {raw_budget!r}")
    budgets.update({k: float(v) for k, v in raw_budget.items()})
    registry = registered_checks()
    unknown = sorted(set(section) - set(registry))
    if unknown:
        raise UsageError(f"site config checks: unknown check(s) {unknown}; valid: "
                         f"{', '.join(registry)}, {SITE_MODULES_KEY}, {SUITE_BUDGET_KEY}")
    planned = []
    for name, chk in registry.items():
        overrides = section.get(name, {})
        if not isinstance(overrides, dict):
            raise UsageError(f"site config checks.{name} must be an object of parameters")
        params = chk.resolve_params(overrides)
        bad = sorted(set(map(str, params["skip_stages"])) - set(STAGES))
        if bad:
            raise UsageError(f"site config checks.{name}.skip_stages: unknown stage(s) "
                             f"{bad}; valid: {', '.join(STAGES)}")
        if params["enabled"] and (suite == "all" or suite in chk.suites):
            planned.append((chk, params))
    return planned, budgets[DEEP if suite == "all" else suite]


def run_suite(stage: str, node: str, job: str | None = None,
              config: SiteConfig | None = None, probes: Probes | None = None,
              journal: bool = True, suite: str | None = None, job_uid: int | None = None,
              job_gpus: frozenset[int] | None = None) -> SuiteResult:
    """Run the suite for ``stage`` on ``node``; journal it; never drains (callers do).

    Raises UsageError for a bad stage, suite or check configuration.
    """
    if stage not in STAGES:
        raise UsageError(f"unknown stage {stage!r}; valid: {', '.join(STAGES)}")
    cfg = config if config is not None else load_site_config()
    state_dir = cfg.state_path(node)
    suite = suite or STAGE_SUITE.get(stage, DEEP)
    planned, budget = plan_suite(suite, cfg)
    planned = [(chk, params) for chk, params in planned if stage not in params["skip_stages"]]
    # Our own directory: create it so a fresh node does not fail host_disk_free on it.
    state_dir.mkdir(parents=True, exist_ok=True)
    probes = probes if probes is not None else Probes.for_node(state_dir,
                                                              cfg.injection_enabled)
    run_id = f"{int(time.time())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    deadline = time.monotonic() + budget
    results = []
    for chk, params in planned:
        left = deadline - time.monotonic()
        if left <= 0:
            results.append(CheckResult(chk.name, Status.FAIL,
                                       f"{chk.name}: not run, suite budget of {budget:g} s "
                                       "spent, expected the suite to fit", {"budget_s": budget},
                                       0.0, False))
            continue
        params = {**params, "budget_s": min(params["budget_s"], left)}
        ctx = CheckContext(probes.view(), node, job, stage, cfg, job_uid, job_gpus)
        results.append(run_check(chk, ctx, params))
    path = journal_path(node, cfg) if journal else None
    now = time.time()
    verdict = document(node, job, stage, suite, run_id, results, now)
    if path is not None:
        try:
            write_run(path, make_records(node, job, stage, suite, run_id, results, now))
            write_document(document_path(node, cfg), verdict)
        except OSError as exc:
            # The journal is bookkeeping: failing to write it is reported, but it is
            # no evidence against the node and must not fail the prolog.
            log.error("could not journal the %s suite on %s: %s", suite, node, exc)
            path = None
    return SuiteResult(node, job, stage, suite, run_id, results, path, verdict)


def job_identity(environ: Mapping[str, str]) -> tuple[int | None, frozenset[int] | None]:
    """The job's uid and GPU indices from slurmd's environment (SLURM_JOB_UID,
    SLURM_JOB_GPUS); strictly parsed, never evaluated; (None, None) when absent."""
    uid_text = environ.get("SLURM_JOB_UID", "")
    uid = int(uid_text) if uid_text.isdigit() else None
    gpus_text = environ.get("SLURM_JOB_GPUS", "")
    parts = [p for p in gpus_text.split(",") if p]
    gpus = frozenset(int(p) for p in parts) if parts and all(p.isdigit() for p in parts) else None
    return uid, gpus
