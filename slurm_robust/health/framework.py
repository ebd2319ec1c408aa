"""The check contract: a registry of small check functions, their parameters, their budgets.

A check is a plain function ``fn(ctx, params) -> Outcome`` registered with :func:`check`::

    @check("host_mem_available", suites=QUICK_AND_DEEP, budget_s=1.0,
           params={"min_gib": 1.0})
    def host_mem_available(ctx, params):
        avail = ctx.probes.get("mem_available_bytes")
        if avail < params["min_gib"] * GIB:
            return fail(f"actual {avail / GIB:.2f} GiB available, expected >= ...",
                        available_bytes=avail)
        return ok(available_bytes=avail)

It reads every fact through ``ctx.probes`` (so injection and tests reach it through the
one probe layer), decides, and returns numbers as evidence. It never drains, journals or
prints: the suite does that.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.errors import UsageError
from slurm_robust.health.errors import NoNVMLError, NVMLHungError
from slurm_robust.health.probes import ProbeView
from slurm_robust.taxonomy import FailureClass
from slurm_robust.vocabulary import HealthStatus

log = logging.getLogger("slurm_robust.health")

QUICK = "quick"
DEEP = "deep"
QUICK_AND_DEEP = (QUICK, DEEP)
DEEP_ONLY = (DEEP,)
# Parameters every check accepts, besides its own. ``skip_stages``: stages (prolog,
# epilog, reserve, resume, manual) where the site does not run the check although its
# suite runs there, e.g. a collective test only when a node is re-admitted, not after
# every job.
COMMON_PARAMS = ("enabled", "budget_s", "skip_stages", "on_error")
#: ``on_error``: what a check that cannot run (its program raised: an ``error``, an
#: unknown verdict) means where a node is admitted (the deep check that returns a node,
#: the reserve's deep pass). ``open``: nothing, the other checks decide. ``closed``: the
#: node is not admitted until the check can run. In service (prolog, epilog, monitor) an
#: error never drains, whatever the policy: a user who can make a check crash must not
#: be able to drain nodes with it.
ON_ERROR_POLICIES = ("open", "closed")


#: A check's verdict (``warn`` and ``skip`` pass; only ``fail`` drains; ``error`` is the
#: check's own failure, never evidence against the node): the shared vocabulary's.
Status = HealthStatus


@dataclass(frozen=True)
class Outcome:
    """What a check function returns; ``reason`` omits the check name (added by the suite)."""

    status: Status
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def ok(**evidence: Any) -> Outcome:
    return Outcome(Status.OK, evidence)


def warn(reason: str, **evidence: Any) -> Outcome:
    return Outcome(Status.WARN, evidence, reason)


def fail(reason: str, **evidence: Any) -> Outcome:
    return Outcome(Status.FAIL, evidence, reason)


def skip(reason: str, **evidence: Any) -> Outcome:
    return Outcome(Status.SKIP, evidence, reason)


@dataclass(frozen=True)
class CheckContext:
    """What a check may look at. ``probes`` is the only way to read hardware and OS facts."""

    probes: ProbeView
    node: str
    job: str | None
    stage: str
    config: Any  # SiteConfig; Any to keep this module free of import cycles
    job_uid: int | None = None  # the job's user (from slurmd's environment), if any
    job_gpus: frozenset[int] | None = None  # the job's GPU indices, None: unknown/all


@dataclass(frozen=True)
class CheckResult:
    """One check's result as journaled: ``reason`` is ``"<check>: ..."`` or empty."""

    check: str
    status: Status
    reason: str
    evidence: dict[str, Any]
    duration_s: float
    injected: bool
    on_error: str = "open"

    @property
    def blocks_admission(self) -> bool:
        """An error of a fail-closed check: the node is not admitted on this run."""
        return self.status is Status.ERROR and self.on_error == "closed"


CheckFn = Callable[[CheckContext, Mapping[str, Any]], Outcome]


#: The in-job monitor's kinds that run checks (launcher/node/monitor.py schedules each).
IN_JOB_KINDS = ("gpu", "network", "host")


@dataclass(frozen=True)
class InJob:
    """What the in-job monitor (launcher/node/monitor.py) does with a check, declared
    where the check is: the ``kind`` whose schedule runs it, the incident class ``cls``
    its finding is handled as (None: the monitor judges it from the evidence, as an
    Xid's from the Xid catalogue), whether a failure is ``fatal`` (the controller evicts
    the node), and whether the kind runs it by ``default`` (a site may list the others
    in its ``monitor`` section). A check without one never runs in-job."""

    kind: str
    cls: FailureClass | None
    fatal: bool = False
    default: bool = True


@dataclass(frozen=True)
class Check:
    """A registered check: name, the suites it belongs to, budget, default parameters,
    and what the in-job monitor does with it (None: nothing)."""

    name: str
    fn: CheckFn
    suites: tuple[str, ...]
    budget_s: float
    params: Mapping[str, Any]
    gpu: bool = False
    in_job: InJob | None = None

    def resolve_params(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overlaid with the site's values; unknown or mistyped keys are errors."""
        merged: dict[str, Any] = {"enabled": True, "budget_s": self.budget_s,
                                  "skip_stages": [], "on_error": "open", **self.params}
        unknown = sorted(set(overrides) - set(merged))
        if unknown:
            valid = ", ".join(f"{k}={v!r}" for k, v in merged.items())
            raise UsageError(f"site config checks.{self.name}: unknown parameter(s) "
                             f"{unknown}; valid parameters with defaults: {valid}")
        for key, value in overrides.items():
            _check_param_type(self.name, key, merged[key], value)
            merged[key] = value
        if merged["budget_s"] <= 0:
            raise UsageError(f"site config checks.{self.name}.budget_s must be > 0")
        if merged["on_error"] not in ON_ERROR_POLICIES:
            raise UsageError(f"site config checks.{self.name}.on_error must be one of "
                             f"{', '.join(ON_ERROR_POLICIES)}, got {merged['on_error']!r}")
        return merged


def _check_param_type(check_name: str, key: str, default: Any, value: Any) -> None:
    if isinstance(default, bool) or isinstance(value, bool):
        good = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, (int, float)):
        good = isinstance(value, (int, float))
    elif default is None:
        good = True
    else:
        good = isinstance(value, type(default))
    if not good:
        raise UsageError(f"site config checks.{check_name}.{key}={value!r} must be "
                         f"{type(default).__name__} like the default {default!r}")


_REGISTRY: dict[str, Check] = {}


def check(name: str, suites: tuple[str, ...], budget_s: float,
          params: Mapping[str, Any] | None = None,
          gpu: bool = False, in_job: InJob | None = None) -> Callable[[CheckFn], CheckFn]:
    """Register a check function. ``gpu=True``: "no NVML" skips it (or fails it when the
    site expects GPUs); ``in_job``: how the in-job monitor runs it; names must be
    unique."""
    def register(fn: CheckFn) -> CheckFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"check {name!r} is registered twice")
        bad = set(suites) - {QUICK, DEEP}
        if bad or not suites:
            raise ValueError(f"check {name!r}: suites must be a subset of quick/deep")
        if in_job is not None and in_job.kind not in IN_JOB_KINDS:
            raise ValueError(f"check {name!r}: in-job kind must be one of "
                             f"{', '.join(IN_JOB_KINDS)}, got {in_job.kind!r}")
        _REGISTRY[name] = Check(name, fn, tuple(suites), float(budget_s),
                                dict(params or {}), gpu, in_job)
        return fn
    return register


def registered_checks() -> dict[str, Check]:
    """Every registered check by name (the built-in ones register when
    :mod:`slurm_robust.health.checks` is imported, which :mod:`.suite` does)."""
    return dict(_REGISTRY)


def run_check(chk: Check, ctx: CheckContext, params: Mapping[str, Any]) -> CheckResult:
    """Run one check in a daemon thread bounded by its budget; never raises.

    A check that overruns its budget fails (a hung NVML call is the typical cause); its
    thread is abandoned, and if it was inside NVML, later GPU checks fail fast instead of
    waiting again.
    """
    start = time.monotonic()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = chk.fn(ctx, params)
        except BaseException as exc:  # noqa: BLE001 - reported as the check's result
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"check-{chk.name}", daemon=True)
    thread.start()
    thread.join(params["budget_s"])
    duration = time.monotonic() - start
    if thread.is_alive():
        if ctx.probes.in_nvml:
            ctx.probes.mark_nvml_hung(params["budget_s"])
        outcome = fail(f"did not finish within its budget, actual > {params['budget_s']:g} s, "
                       f"expected <= {params['budget_s']:g} s",
                       budget_s=params["budget_s"], in_nvml=ctx.probes.in_nvml)
    elif "error" in box:
        outcome = _outcome_from_error(chk, ctx, box["error"])
    else:
        outcome = box.get("outcome")
        if not isinstance(outcome, Outcome):
            outcome = fail(f"returned {type(outcome).__name__}, expected an Outcome")
    reason = f"{chk.name}: {outcome.reason}" if outcome.reason else ""
    return CheckResult(chk.name, outcome.status, reason, dict(outcome.evidence),
                       round(duration, 4), ctx.probes.used_injected,
                       str(params.get("on_error", "open")))


def _outcome_from_error(chk: Check, ctx: CheckContext, exc: BaseException) -> Outcome:
    if isinstance(exc, NoNVMLError):
        expected = getattr(ctx.config, "gpus_per_node", None)
        if expected:
            return fail(f"actual no NVML ({exc}), expected {expected} GPUs",
                        gpus_expected=expected)
        return skip("skipped: no NVML", nvml=False)
    if isinstance(exc, NVMLHungError):
        return fail(f"actual NVML call hung ({exc}), expected an answer within the budget",
                    nvml_hung=True)
    # A crashing check is an error of the check program, reported and counted, never
    # silently a pass; but it is not evidence against the node:
    # other users can feed a check input it chokes on, and must not drain nodes that way.
    log.warning("check %s on %s raised %s: %s (journaled as an error; the node is not "
                "drained for it)", chk.name, ctx.node, type(exc).__name__, exc)
    return Outcome(Status.ERROR, {"error": type(exc).__name__},
                   f"check program error {type(exc).__name__}: {exc}")
