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
    InJob,
    Outcome,
    Status,
    check,
    fail,
    ok,
    warn,
)
from slurm_robust.taxonomy import FailureClass

GIB = 1 << 30
HOST_BUDGET_S = 2.0
#: Checks of resources any user can fill (disk space, memory, /dev/shm): a failure of
#: these alone says little about the node's hardware, so it never makes a node a repeat
#: offender (node_program.py).
RESOURCE_CHECKS = frozenset({"host_disk_free", "host_mem_available", "deep_shm_free"})


def expand(ctx: CheckContext, template: str) -> str:
    """``{node}`` and ``{state_dir}`` in a configured path, for this node."""
    state_dir = str(ctx.config.state_path(ctx.node))
    return template.replace("{state_dir}", state_dir).replace("{node}", ctx.node)


def neighbours(ctx: CheckContext, usage: Mapping[Any, int], min_uid: int) -> dict[int, int]:
    """Bytes held by other users: ordinary uids (>= ``min_uid``) other than the job's."""
    mine = ctx.job_uid if ctx.job_uid is not None else -1
    return {int(uid): int(b) for uid, b in usage.items()
            if int(uid) >= min_uid and int(uid) != mine and int(b) > 0}


def attributed(ctx: CheckContext, probe: str, main_probe: str, *args: Any
                ) -> dict[int, int]:
    """Other users' usage, read only when it can be: a rehearsal that injects the free
    space alone is not second-guessed by a real reading; a reading that fails is none."""
    if ctx.probes.injected(main_probe) and not ctx.probes.injected(probe):
        return {}
    try:
        return dict(ctx.probes.get(probe, *args))
    except OSError:
        return {}


def shortfall(ctx: CheckContext, what: str, have: int, want: int,
              others: Mapping[int, int], **evidence: Any) -> Outcome:
    """Fail for a shortfall of the node's own; warn, naming the uids, when other users'
    files or processes account for it: the node is not at fault, and draining it would
    let any user take nodes out of service by filling /tmp, /dev/shm or memory."""
    held = sum(others.values())
    reason = f"actual {have / GIB:.2f} GiB {what}, expected >= {want / GIB:g} GiB"
    if others:
        evidence["other_uids"] = {str(u): b for u, b in sorted(others.items())}
    if have + held >= want and others:
        uids = ", ".join(str(u) for u in sorted(others))
        return warn(f"{reason}: other users (uids {uids}) hold {held / GIB:.2f} GiB; "
                    "not the node's fault, not drained", **evidence)
    return fail(reason, **evidence)


@check("host_disk_free", QUICK_AND_DEEP, HOST_BUDGET_S,
       {"paths": ["{state_dir}", "/tmp"], "min_free_gib": 1.0, "min_uid": 1000},
       in_job=InJob("host", FailureClass.DISK_FULL))
def host_disk_free(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Each configured path has at least ``min_free_gib`` free (a missing path fails).

    Space held by other users' files (uids >= ``min_uid`` other than the job's) that
    explains the shortfall is a warning naming them, not a failure (``shortfall``)."""
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
    if not low:
        return ok(free_bytes=free, min_bytes=want)
    outcomes = [shortfall(ctx, f"free on {path}", b, want,
                          neighbours(ctx, attributed(ctx, "disk_usage_by_uid",
                                                      "disk_free_bytes", path),
                                     params["min_uid"]),
                          free_bytes=free, min_bytes=want) for path, b in low]
    return next((o for o in outcomes if o.status is Status.FAIL), outcomes[0])


@check("host_mem_available", QUICK_AND_DEEP, HOST_BUDGET_S, {"min_gib": 1.0, "min_uid": 1000},
       in_job=InJob("host", FailureClass.CPU_OOM))
def host_mem_available(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """MemAvailable at least ``min_gib``; memory other users' processes hold that
    explains the shortfall is a warning naming them (``shortfall``)."""
    avail = int(ctx.probes.get("mem_available_bytes"))
    want = int(params["min_gib"] * GIB)
    if avail >= want:
        return ok(available_bytes=avail, min_bytes=want)
    others = neighbours(ctx, attributed(ctx, "mem_by_uid", "mem_available_bytes"),
                        params["min_uid"])
    return shortfall(ctx, "available", avail, want, others, available_bytes=avail,
                     min_bytes=want)


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
