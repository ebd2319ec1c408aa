"""Deep storage checks: local disk write/read, /dev/shm free space, required mounts."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Mapping
from typing import Any

from slurm_robust.health.checks.host import GIB, attributed, expand, neighbours, shortfall
from slurm_robust.health.framework import DEEP_ONLY, CheckContext, Outcome, check, fail, ok


@check("deep_disk_io", DEEP_ONLY, 20.0,
       {"path": "{state_dir}", "mib": 16, "min_free_gib": 1.0, "min_write_mbps": 1.0})
def deep_disk_io(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Write ``mib`` MiB to the local disk (fsync), read it back, compare checksums;
    enough free space and write throughput."""
    directory = expand(ctx, params["path"])
    free = int(ctx.probes.get("disk_free_bytes", directory))
    if free < params["min_free_gib"] * GIB:
        return fail(f"actual {free / GIB:.2f} GiB free on {directory}, expected >= "
                    f"{params['min_free_gib']:g} GiB", free_bytes=free)
    data = os.urandom(1 << 20) * int(params["mib"])
    # Random and O_EXCL|O_NOFOLLOW: a name planted by someone else is never opened.
    path = os.path.join(directory, f".deep_disk_io.{secrets.token_hex(8)}.tmp")
    os.makedirs(directory, exist_ok=True)
    try:
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        write_s = time.perf_counter() - start
        with open(path, "rb") as fh:
            back = fh.read()
    finally:
        if os.path.exists(path):
            os.unlink(path)
    mbps = round(len(data) / max(write_s, 1e-9) / 1e6, 1)
    evidence = {"free_bytes": free, "write_mbps": mbps, "mib": params["mib"]}
    if hashlib.sha256(back).digest() != hashlib.sha256(data).digest():
        return fail(f"actual read-back differs from what was written on {directory}, "
                    "expected identical bytes", **evidence)
    if mbps < params["min_write_mbps"]:
        return fail(f"actual {mbps:.1f} MB/s write on {directory}, expected >= "
                    f"{params['min_write_mbps']:g} MB/s", **evidence)
    return ok(**evidence)


@check("deep_shm_free", DEEP_ONLY, 5.0, {"path": "/dev/shm", "min_free_gib": 1.0,
                                        "min_uid": 1000})
def deep_shm_free(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Shared memory (in-memory checkpoints live there) has ``min_free_gib`` free; space
    other users' files hold that explains the shortfall is a warning naming them."""
    path = expand(ctx, params["path"])
    free = int(ctx.probes.get("shm_free_bytes", path))
    want = int(params["min_free_gib"] * GIB)
    if free >= want:
        return ok(free_bytes=free, min_bytes=want)
    others = neighbours(ctx, attributed(ctx, "disk_usage_by_uid", "shm_free_bytes", path),
                        params["min_uid"])
    return shortfall(ctx, f"free in {params['path']}", free, want, others,
                     free_bytes=free, min_bytes=want)


@check("deep_mounts", DEEP_ONLY, 5.0, {"required": []})
def deep_mounts(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Every required mount point is mounted."""
    mounted = set(ctx.probes.get("mounts"))
    required = [expand(ctx, m) for m in params["required"]]
    missing = [m for m in required if m not in mounted]
    if missing:
        return fail(f"actual {missing[0]} not mounted, expected mounted",
                    missing=missing, required=len(required))
    return ok(required=len(required), missing=[])
