"""GPU checks through NVML (via the probe layer). All run in both suites.

With no NVML they skip ("skipped: no NVML") unless the site sets ``gpus_per_node``, then
they fail; an injected probe makes them run on the injected reading (see probes.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from slurm_robust.health.framework import (
    QUICK_AND_DEEP,
    CheckContext,
    InJob,
    Outcome,
    check,
    fail,
    ok,
    warn,
)
from slurm_robust.taxonomy import FailureClass

# Xids that mean the GPU or its memory cannot be trusted for the next job (NVIDIA's
# Xid catalogue: 13 graphics engine exception, 31 MMU fault, 43 reset channel, 45 preemptive
# cleanup, 48 double-bit ECC, 61/62 internal micro-controller, 63/64 row-remap events,
# 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained/
# uncontained ECC, 119/120 GSP errors).
CRITICAL_XIDS = [13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120]
GPU_BUDGET_S = 3.0
# NVML clocks-throttle-reason bits.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
THROTTLE_FAIL_MASK = THROTTLE_HW_SLOWDOWN | THROTTLE_HW_THERMAL | THROTTLE_HW_POWER_BRAKE
THROTTLE_WARN_MASK = THROTTLE_SW_POWER_CAP | THROTTLE_SW_THERMAL


def _gpus_str(gpus: list[int]) -> str:
    return ",".join(str(g) for g in gpus)


@check("nvml_responsive", QUICK_AND_DEEP, GPU_BUDGET_S, {"max_s": 1.0}, gpu=True)
def nvml_responsive(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """NVML answers a trivial query quickly (a hung call is bounded by ``budget_s``)."""
    start = time.monotonic()
    ctx.probes.gpu("gpu_count")
    took = time.monotonic() - start
    if took > params["max_s"]:
        return fail(f"actual NVML answer in {took:.2f} s, expected <= {params['max_s']:g} s",
                    latency_s=round(took, 4))
    return ok(latency_s=round(took, 4))


# In-job: a GPU gone, or memory the GPU cannot trust any more, is fatal (the node is
# evicted); a hardware Xid is judged by the monitor from the Xid catalogue.
@check("gpu_count", QUICK_AND_DEEP, GPU_BUDGET_S, {"expected": -1}, gpu=True,
       in_job=InJob("gpu", FailureClass.GPU_UNAVAILABLE, fatal=True))
def gpu_count(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """As many GPUs as configured (``expected``, default the site's ``gpus_per_node``)."""
    count = ctx.probes.gpu("gpu_count")["gpu_count"]
    expected = params["expected"]
    if expected < 0:
        expected = ctx.config.gpus_per_node
    if expected is not None and count != expected:
        return fail(f"actual {count} GPUs, expected {expected}", count=count, expected=expected)
    return ok(count=count, expected=expected)


@check("gpu_xid", QUICK_AND_DEEP, GPU_BUDGET_S, {"critical": CRITICAL_XIDS}, gpu=True,
       in_job=InJob("gpu", None))
def gpu_xid(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """No critical Xid since the last check; other Xids warn."""
    events = ctx.probes.gpu("xid_events")["xid_events"] or []
    critical = set(params["critical"])
    bad = [e for e in events if int(e["xid"]) in critical]
    evidence = {"events": [{"gpu": int(e["gpu"]), "xid": int(e["xid"])} for e in events]}
    if bad:
        first = bad[0]
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return fail(f"Xid {first['xid']} on GPU {first['gpu']}{more}, expected no critical Xid",
                    **evidence)
    if events:
        return warn(f"Xid {events[0]['xid']} on GPU {events[0]['gpu']}, expected none",
                    **evidence)
    return ok(**evidence)


@check("gpu_ecc", QUICK_AND_DEEP, GPU_BUDGET_S, {"max_uncorrectable": 0}, gpu=True,
       in_job=InJob("gpu", FailureClass.GPU_MEMORY_ERROR, fatal=True))
def gpu_ecc(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Volatile (since driver load) uncorrectable ECC errors at most ``max_uncorrectable``."""
    counts = ctx.probes.gpu("ecc_uncorrectable")["ecc_uncorrectable"] or []
    limit = params["max_uncorrectable"]
    bad = [(i, c) for i, c in enumerate(counts) if c is not None and c > limit]
    if bad:
        i, c = bad[0]
        return fail(f"actual {c} uncorrectable ECC errors on GPU {i}, expected <= "
                    f"{params['max_uncorrectable']}", uncorrectable=counts)
    return ok(uncorrectable=counts)


@check("gpu_remap", QUICK_AND_DEEP, GPU_BUDGET_S, {"max_retired_pages": 60}, gpu=True,
       in_job=InJob("gpu", FailureClass.GPU_MEMORY_ERROR, fatal=True))
def gpu_remap(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """No row remapping pending or failed; no page retirement pending; few retired pages."""
    r = ctx.probes.gpu("remap", "retired_pages")
    remap, pages = r["remap"] or [], r["retired_pages"] or []
    evidence = {"remap": remap, "retired_pages": pages}
    for i, info in enumerate(remap):
        if info and info.get("failure"):
            return fail(f"row remapping failed on GPU {i}, expected no failure", **evidence)
        if info and info.get("pending"):
            return fail(f"row remapping pending on GPU {i} (needs a GPU reset), expected none",
                        **evidence)
    for i, info in enumerate(pages):
        if info and info.get("pending"):
            return fail(f"page retirement pending on GPU {i}, expected none", **evidence)
        if info and info.get("count", 0) > params["max_retired_pages"]:
            return fail(f"actual {info['count']} retired pages on GPU {i}, expected <= "
                        f"{params['max_retired_pages']}", **evidence)
    return ok(**evidence)


@check("gpu_thermal", QUICK_AND_DEEP, GPU_BUDGET_S, {"max_temp_c": 85}, gpu=True,
       in_job=InJob("gpu", FailureClass.GPU_UNAVAILABLE))
def gpu_thermal(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Temperature at most ``max_temp_c``; no hardware thermal/power throttling (fail);
    software power-cap or thermal throttling warns."""
    r = ctx.probes.gpu("temperature_c", "throttle_reasons")
    temps, reasons = r["temperature_c"] or [], r["throttle_reasons"] or []
    evidence = {"temperature_c": temps, "throttle_reasons": reasons}
    hot = [(i, t) for i, t in enumerate(temps) if t is not None and t > params["max_temp_c"]]
    if hot:
        return fail(f"actual {hot[0][1]} C on GPU {hot[0][0]}, expected <= "
                    f"{params['max_temp_c']} C", **evidence)
    hw = [i for i, m in enumerate(reasons) if m and m & THROTTLE_FAIL_MASK]
    if hw:
        return fail(f"hardware throttling (mask {reasons[hw[0]]:#x}) on GPU(s) {_gpus_str(hw)}, "
                    "expected none", **evidence)
    sw = [i for i, m in enumerate(reasons) if m and m & THROTTLE_WARN_MASK]
    if sw:
        return warn(f"software throttling (mask {reasons[sw[0]]:#x}) on GPU(s) {_gpus_str(sw)}, "
                    "expected none", **evidence)
    return ok(**evidence)


@check("gpu_pcie", QUICK_AND_DEEP, GPU_BUDGET_S, {"fail_on_gen": False}, gpu=True)
def gpu_pcie(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """PCIe link width at its maximum (fail). Generation below maximum only warns by
    default: idle GPUs lower their link generation to save power."""
    links = ctx.probes.gpu("pcie")["pcie"] or []
    evidence = {"pcie": links}
    narrow = [i for i, lk in enumerate(links) if lk and lk["width"] < lk["max_width"]]
    if narrow:
        lk = links[narrow[0]]
        return fail(f"actual PCIe x{lk['width']} on GPU {narrow[0]}, expected "
                    f"x{lk['max_width']}", **evidence)
    slow = [i for i, lk in enumerate(links) if lk and lk["gen"] < lk["max_gen"]]
    if slow:
        lk = links[slow[0]]
        text = f"actual PCIe gen {lk['gen']} on GPU {slow[0]}, expected gen {lk['max_gen']}"
        return fail(text, **evidence) if params["fail_on_gen"] else warn(text, **evidence)
    return ok(**evidence)


@check("gpu_nvlink", QUICK_AND_DEEP, GPU_BUDGET_S, {}, gpu=True,
       in_job=InJob("gpu", FailureClass.GPU_UNAVAILABLE, default=False))
def gpu_nvlink(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """Every NVLink link present is up."""
    links = ctx.probes.gpu("nvlink")["nvlink"] or []
    down = [(i, lk["down"]) for i, lk in enumerate(links) if lk and lk["down"] > 0]
    if down:
        return fail(f"actual {down[0][1]} NVLink link(s) down on GPU {down[0][0]}, "
                    "expected 0", nvlink=links)
    return ok(nvlink=links)


@check("gpu_procs", QUICK_AND_DEEP, GPU_BUDGET_S, {}, gpu=True)
def gpu_procs(ctx: CheckContext, params: Mapping[str, Any]) -> Outcome:
    """No compute process on the job's GPUs (all GPUs when the job's are unknown): before a
    job they are leftovers of an earlier one; after it, processes that outlived it."""
    procs = ctx.probes.gpu("compute_procs")["compute_procs"] or []
    gpus = ctx.job_gpus
    mine = [p for p in procs if gpus is None or int(p["gpu"]) in gpus]
    if mine:
        return fail(f"actual {len(mine)} compute process(es) on GPU {mine[0]['gpu']} "
                    f"(pid {mine[0]['pid']}), expected 0", procs=mine,
                    job_gpus=None if gpus is None else sorted(gpus))
    return ok(procs=0, job_gpus=None if gpus is None else sorted(gpus))
