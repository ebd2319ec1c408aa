"""Host checks of the quick suite: disk, memory, stray processes, stale locks.

Path parameters may contain ``{node}`` and ``{state_dir}`` (expanded per node).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from slurm_robust.health.framework import (
    QUICK_AND_DEEP,
    CheckContext,
    Outcome,
    check,
    fail,
    ok,
    warn,
)

GIB = 1 << 30
HOST_BUDGET_S = 2.0


def expand(ctx: CheckContext, template: str) -> str:
    """``{node}`` and ``{state_dir}`` in a configured path, for this node."""
    state_dir = str(ctx.config.state_path(ctx.node))
    return template.replace("{state_dir}", state_dir).replace("{node}", ctx.node)


@check("host_disk_free", QUICK_AND_DEEP, HOST_BUDGET_S,
       {"paths": ["{state_dir}", "/tmp"], "min_free_gib": 1.0})
def host_disk_free(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Each configured path has at least ``min_free_gib`` free (a missing path fails)."""
    free: dict[str, int] = {}
    want = int(params["min_free_gib"] * GIB)
    for template in params["paths"]:
        path = expand(ctx, template)
        try:
            free[path] = int(ctx.probes.get("disk_free_bytes", path))
        except FileNotFoundError:
            return fail(f"actual {path} missing, expected a directory with >= "
                        f"{params['min_free_gib']:g} GiB free", free_bytes=free, missing=path)
    low = [(p, b) for p, b in free.items() if b < want]
    if low:
        path, b = low[0]
        return fail(f"actual {b / GIB:.2f} GiB free on {path}, expected >= "
                    f"{params['min_free_gib']:g} GiB", free_bytes=free, min_bytes=want)
    return ok(free_bytes=free, min_bytes=want)


@check("host_mem_available", QUICK_AND_DEEP, HOST_BUDGET_S, {"min_gib": 1.0})
def host_mem_available(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """MemAvailable at least ``min_gib``."""
    avail = int(ctx.probes.get("mem_available_bytes"))
    want = int(params["min_gib"] * GIB)
    if avail < want:
        return fail(f"actual {avail / GIB:.2f} GiB available, expected >= "
                    f"{params['min_gib']:g} GiB", available_bytes=avail, min_bytes=want)
    return ok(available_bytes=avail, min_bytes=want)


@check("host_stray_procs", ("quick",), HOST_BUDGET_S,
       {"min_uid": 1000, "allowed_uids": [], "fail": False})
def host_stray_procs(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Processes of ordinary users (uid >= ``min_uid``) other than the job's user.

    Warns by default: on nodes shared between jobs another user's processes are normal;
    set ``fail`` on sites that allocate whole nodes, where they are leftovers.
    """
    allowed = set(params["allowed_uids"])
    allowed.add(ctx.job_uid if ctx.job_uid is not None else os.getuid())
    procs = ctx.probes.get("processes")
    stray = [p for p in procs if p["uid"] >= params["min_uid"] and p["uid"] not in allowed]
    if not stray:
        return ok(stray=0, processes=len(procs))
    uids = sorted({p["uid"] for p in stray})
    evidence = {"stray": len(stray), "uids": uids,
                "examples": [{"pid": p["pid"], "uid": p["uid"], "comm": p["comm"]}
                             for p in stray[:5]]}
    text = (f"actual {len(stray)} process(es) of uid(s) {','.join(map(str, uids))}, "
            "expected none of other users")
    return fail(text, **evidence) if params["fail"] else warn(text, **evidence)


@check("host_stale_lock", ("quick",), HOST_BUDGET_S,
       {"patterns": ["{state_dir}/locks/*.lock"]})
def host_stale_lock(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """No lock file whose owner is gone.

    Contract for node-level locks: a component holding one writes its pid into
    ``<state_dir>/locks/<name>.lock`` and removes the file when done; a file whose pid is
    not alive was left by a crash and would block the next job's component.
    """
    locks = ctx.probes.get("lock_files", [expand(ctx, p) for p in params["patterns"]])
    stale = [lk for lk in locks if not lk["alive"]]
    if stale:
        lk = stale[0]
        return fail(f"actual stale lock {lk['path']} (pid {lk['pid']} gone, age "
                    f"{lk['age_s']:.0f} s), expected none", stale=stale[:5], locks=len(locks))
    return ok(locks=len(locks), stale=0)
