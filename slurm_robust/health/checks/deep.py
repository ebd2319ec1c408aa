"""Deep compute checks (epilog, reserve, resume): matmul, memory bandwidth, collective.

Kept small by default so the epilog adds a few seconds per job on a CPU node; sites with
GPUs raise the sizes and thresholds through ``checks.<name>`` in the site config. The CPU
throughput floors are loose on purpose (about 1/100 of one core here, best-of timing): nodes share
cores with running jobs, and a floor that trips under load would drain healthy nodes; they
catch a node that is broken, not one that is busy.
On GPU nodes (``gpus_per_node`` set) the matmul runs on every GPU through torch, imported
inside the check so the prolog never pays for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from slurm_robust.health.framework import DEEP_ONLY, CheckContext, Outcome, check, fail, ok


@check("deep_matmul", DEEP_ONLY, 20.0,
       {"cpu_n": 256, "gpu_n": 4096, "max_rel_err": 1e-4, "min_gflops": 1.0,
        "min_gpu_gflops": 1000.0})
def deep_matmul(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """float32 matmul against a float64 reference: correct (relative error at most
    ``max_rel_err``) and fast enough (``min_gflops`` CPU, ``min_gpu_gflops`` per GPU)."""
    if ctx.config.gpus_per_node:
        return _gpu_matmul(params)
    # One BLAS thread: spinning BLAS workers on cores shared with jobs measure contention,
    # not the node. Only read when numpy is first imported (as in the epilog); a process
    # that already has numpy keeps its environment, which its own children inherit.
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np

    n = int(params["cpu_n"])
    rng = np.random.default_rng(1234)
    a64, b64 = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)
    ref = a32.astype(np.float64) @ b32.astype(np.float64)
    best, c, deadline = float("inf"), a32, time.perf_counter() + 0.2
    for _ in range(20):  # best of several: a preempted repetition says nothing of the node
        start = time.perf_counter()
        c = a32 @ b32
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    err = float(np.abs(c - ref).max() / np.abs(ref).max())
    gflops = 2 * n ** 3 / best / 1e9
    return _matmul_verdict(params, [{"device": "cpu", "rel_err": err, "gflops": gflops}],
                           params["min_gflops"])


def _gpu_matmul(params: Mapping[str, Any]) -> Outcome:
    import torch

    if not torch.cuda.is_available():
        return fail("actual torch sees no CUDA device, expected the configured GPUs",
                    cuda=False)
    torch.backends.cuda.matmul.allow_tf32 = False  # we test float32, not TF32
    n = int(params["gpu_n"])
    rows = []
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        gen = torch.Generator(device=dev).manual_seed(1234)
        a = torch.randn(n, n, device=dev, generator=gen)
        b = torch.randn(n, n, device=dev, generator=gen)
        ref = a.double() @ b.double()
        c = a @ b
        torch.cuda.synchronize(dev)
        reps, start = 10, time.perf_counter()
        for _ in range(reps):
            c = a @ b
        torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - start
        err = float(((c.double() - ref).abs().max() / ref.abs().max()).item())
        rows.append({"device": f"cuda:{i}", "rel_err": err,
                     "gflops": 2 * n ** 3 * reps / elapsed / 1e9})
    return _matmul_verdict(params, rows, params["min_gpu_gflops"])


def _matmul_verdict(params: Mapping[str, Any], rows: list[dict[str, Any]],
                    min_gflops: float) -> Outcome:
    for r in rows:
        r["rel_err"], r["gflops"] = float(f"{r['rel_err']:.3g}"), round(r["gflops"], 2)
    wrong = [r for r in rows if not r["rel_err"] <= params["max_rel_err"]]
    if wrong:
        r = wrong[0]
        return fail(f"actual relative error {r['rel_err']:.3g} on {r['device']}, expected <= "
                    f"{params['max_rel_err']:g}", devices=rows)
    slow = [r for r in rows if r["gflops"] < min_gflops]
    if slow:
        r = slow[0]
        return fail(f"actual {r['gflops']:.3g} GFLOP/s on {r['device']}, expected >= "
                    f"{min_gflops:g}", devices=rows)
    return ok(devices=rows)


@check("deep_membw", DEEP_ONLY, 10.0, {"mib": 64, "min_gbps": 0.5})
def deep_membw(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Host memory copy bandwidth (read + write bytes per second) at least ``min_gbps``."""
    import numpy as np

    src = np.ones(int(params["mib"]) << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch: page faults are not bandwidth
    best, deadline = float("inf"), time.perf_counter() + 0.2
    for _ in range(10):  # best of several, as in deep_matmul
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    gbps = round(2 * src.nbytes / best / 1e9, 2)
    if not bool(dst[-1] == 1):
        return fail("actual copy mismatch, expected identical buffers", gbps=gbps)
    if gbps < params["min_gbps"]:
        return fail(f"actual {gbps:.2f} GB/s, expected >= {params['min_gbps']:g} GB/s",
                    gbps=gbps, mib=params["mib"])
    return ok(gbps=gbps, mib=params["mib"])


@check("deep_collective", DEEP_ONLY, 30.0,
       {"world": 2, "numel": 262144, "timeout_s": 20.0, "min_gbps": 0.0})
def deep_collective(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """All-reduce loopback on this node's devices (torch.distributed): one rank per GPU
    over NCCL when the site has GPUs, else ``world`` ranks over gloo; result exact."""
    gpus = ctx.config.gpus_per_node
    backend, world = ("nccl", gpus) if gpus else ("gloo", int(params["world"]))
    argv = [sys.executable, "-I", "-m", "slurm_robust.health.collective", "--world",
            str(world), "--backend", backend, "--numel", str(int(params["numel"])),
            "--timeout-s", str(params["timeout_s"])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              timeout=params["timeout_s"] + 10, check=False)
    except subprocess.TimeoutExpired:
        return fail(f"actual no result within {params['timeout_s'] + 10:g} s, expected the "
                    "all-reduce to finish", backend=backend, world=world)
    try:
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " ".join(proc.stderr.strip().splitlines()[-1:])[:160]
        return fail(f"actual exit {proc.returncode} ({tail}), expected a result",
                    backend=backend, world=world, exit_code=proc.returncode)
    evidence = {k: res[k] for k in ("world", "backend", "seconds", "gbps", "max_err")}
    if not res["ok"]:
        return fail(f"actual max error {res['max_err']} in the all-reduce, expected 0",
                    **evidence)
    if res["gbps"] < params["min_gbps"]:
        return fail(f"actual {res['gbps']} GB/s, expected >= {params['min_gbps']:g} GB/s",
                    **evidence)
    return ok(**evidence)
