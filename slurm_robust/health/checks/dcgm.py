"""DCGM diagnostics at the level that matches the moment (deep suite, where dcgmi exists).

NVIDIA's levels: 1 (seconds: readiness), 2 (about two minutes: after a failure), 3 (about
fifteen minutes: a post-mortem). By stage, ``levels`` (0: not run): the reserve's deep
pass runs level 1, the deep check of a node a job blamed (``resume``: the break-fix loop's
deep check and re-validation) level 2, ``slurm-robust check --stage manual`` level 3; the
prolog and epilog none (a job would wait for it). A node without ``dcgmi`` skips it; the
GPU checks through NVML still run there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_robust.health.framework import DEEP_ONLY, CheckContext, Outcome, check, fail, ok
from slurm_robust.health.framework import skip as skipped
from slurm_robust.health.framework import warn as warned

#: Seconds each level may take before the run is called hung (NVIDIA's durations, with
#: room for a node with 8 GPUs).
LEVEL_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 2400.0}
LEVELS = {"prolog": 0, "epilog": 0, "reserve": 1, "resume": 2, "manual": 3}


@check("dcgm_diag", DEEP_ONLY, 2400.0, {"levels": dict(LEVELS)})
def dcgm_diag(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """``dcgmi diag -r LEVEL``: a failed test fails the node, a warning warns."""
    level = int({**LEVELS, **params["levels"]}.get(ctx.stage, 0))
    if level not in (0, *LEVEL_TIMEOUT_S):
        raise ValueError(f"checks.dcgm_diag.levels.{ctx.stage}={level}: use 0 to 3")
    if level == 0:
        return skipped(f"no DCGM level for stage {ctx.stage}")
    timeout = min(float(params["budget_s"]), LEVEL_TIMEOUT_S[level])
    reading = ctx.probes.get("dcgm_diag", level, timeout)
    if reading is None:
        return skipped("dcgmi is not installed")
    tests = reading["tests"]
    failed = [t for t in tests if t["status"] == "fail"]
    warns = [t for t in tests if t["status"] == "warn"]
    evidence = {"level": level, "tests": len(tests), "rc": reading.get("rc"),
                "failed": failed[:8], "warnings": warns[:8]}
    if failed:
        names = ", ".join(t["name"] for t in failed[:4])
        info = next((t["info"] for t in failed if t["info"]), "")
        return fail(f"level {level}: {names} failed" + (f": {info}" if info else ""),
                    **evidence)
    if warns:
        return warned(f"level {level}: {', '.join(t['name'] for t in warns[:4])} warned",
                      **evidence)
    if not tests:
        raise ValueError(f"dcgmi diag -r {level} reported no test")
    return ok(**evidence)
