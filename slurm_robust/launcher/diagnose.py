"""Stop-time diagnosis (ByteRobust's EUD step): check a suspected node before blaming it.

When a failure could be the node's or the user's (a CUDA error, an unknown-side class,
a collective timeout), the agent on the suspected node runs the node's quick checks plus
a short GPU/host self-test (a small matmul against a float64 reference and a memory
bandwidth pass) while the other agents wait, all within one budget. The checks are the
health suites' own (slurm_robust.health): one implementation of each check, the same
probes, so an injected Xid 79 is seen here exactly as the prolog would see it.

What the caller does with the answer (:func:`next_step`):

- failed: evict the node, with the failing checks as the verdict's evidence;
- passed: reattempt in place; if the same error signature comes back after that clean
  reattempt, it is the user's code (stop).

Its elapsed time is the incident's localisation time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from slurm_robust.health.framework import QUICK, CheckContext, CheckResult, Status, run_check
from slurm_robust.health.journal import journal_path, make_records, write_run
from slurm_robust.health.probes import Probes
from slurm_robust.health.suite import failure_reason, plan_suite
from slurm_robust.launcher.wire_records import DiagnosisEvidence
from slurm_robust.site_config import SiteConfig, load_site_config

#: The self-test: deep checks short enough to run while the job waits, with smaller sizes.
#: The CPU matmul is judged on correctness only: a 128x128 product timed inside the busy
#: agent process on shared cores measured 0.18 GFLOP/s on a healthy mini-cluster node, so
#: its throughput floor would blame healthy nodes (the GPU floor stays: the GPUs are idle
#: once the failed generation's workers are stopped).
SELF_TEST: dict[str, dict[str, float]] = {
    "deep_matmul": {"cpu_n": 128, "gpu_n": 2048, "min_gflops": 0.0},
    "deep_membw": {"mib": 32},
}
DEFAULT_BUDGET_S = 30.0
#: Suite name written to the health journal for a diagnosis run (stage "manual").
SUITE = "diagnose"


class NextStep(StrEnum):
    EVICT = "evict"            # the node failed its checks
    REATTEMPT = "reattempt"    # the node passed: restart in place on it
    STOP_USER = "stop_user"    # passed before, and the same signature came back


@dataclass(frozen=True)
class Diagnosis:
    """The outcome of one stop-time diagnosis of one node."""

    node: str
    passed: bool
    complete: bool  # every planned check ran within the budget
    elapsed_s: float
    budget_s: float
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL]

    @property
    def reason(self) -> str:
        """One line for a verdict: the first failing check and its evidence."""
        return failure_reason("diagnosis", self.failures)

    def evidence(self) -> DiagnosisEvidence:
        """What a verdict or an incident records about the diagnosis."""
        return {"node": self.node, "passed": self.passed, "complete": self.complete,
                "elapsed_s": round(self.elapsed_s, 3), "budget_s": self.budget_s,
                "failed": [{"check": r.check, "reason": r.reason, "evidence": r.evidence}
                           for r in self.failures],
                "ran": [r.check for r in self.results if r.status is not Status.SKIP]}


def diagnose(node: str, *, config: SiteConfig | None = None, probes: Probes | None = None,
             budget_s: float = DEFAULT_BUDGET_S, job: str | None = None,
             journal: bool = True, self_test: Mapping[str, Mapping[str, Any]] | None = None,
             clock: Callable[[], float] = time.monotonic) -> Diagnosis:
    """Run the quick checks and the self-test on ``node`` (the calling host) within
    ``budget_s`` seconds; never raises for a failing check, never drains."""
    cfg = config if config is not None else load_site_config()
    tests = dict(SELF_TEST if self_test is None else self_test)
    planned, _ = plan_suite("all", cfg)
    chosen = [(chk, {**params, **tests.get(chk.name, {})}) for chk, params in planned
              if QUICK in chk.suites or chk.name in tests]
    state_dir = cfg.state_path(node)
    state_dir.mkdir(parents=True, exist_ok=True)
    probes = probes if probes is not None else Probes.for_node(
        state_dir, injection_enabled=cfg.injection_enabled)
    start = clock()
    deadline = start + budget_s
    results: list[CheckResult] = []
    complete = True
    for chk, params in chosen:
        left = deadline - clock()
        if left <= 0:
            # Not run is not failed: an unfinished diagnosis blames nobody by itself.
            complete = False
            results.append(CheckResult(chk.name, Status.SKIP,
                                       f"{chk.name}: not run, diagnosis budget of "
                                       f"{budget_s:g} s spent", {"budget_s": budget_s},
                                       0.0, False))
            continue
        params = {**params, "budget_s": min(params["budget_s"], left)}
        ctx = CheckContext(probes.view(), node, job, "manual", cfg)
        results.append(run_check(chk, ctx, params))
    elapsed = clock() - start
    if journal:
        path = journal_path(node, cfg)
        if path is not None:
            run_id = f"diag-{int(time.time())}-{node}"
            write_run(path, make_records(node, job, "manual", SUITE, run_id, results,
                                         time.time()))
    passed = not any(r.status is Status.FAIL for r in results)
    return Diagnosis(node, passed, complete, elapsed, budget_s, results)


def next_step(diagnosis: Diagnosis, same_signature_after_pass: bool) -> NextStep:
    """What to do after a diagnosis: evict on failure; on a pass, reattempt in place,
    unless the same error already came back after an earlier pass (user code)."""
    if not diagnosis.passed:
        return NextStep.EVICT
    return NextStep.STOP_USER if same_signature_after_pass else NextStep.REATTEMPT
