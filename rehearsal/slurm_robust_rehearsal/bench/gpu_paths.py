"""The NVML, NCCL and determinism paths of slurm_robust on a real GPU node.

Part of the prepared GPU check (``python -m slurm_robust.ckpt.gpu_check``): everything
here runs the production code path unchanged, with no injection, so a first lent GPU
validates what CPU-only CI can only reach through the probe injection point:

- ``nvml``: every GPU probe the checks, the live monitor and the failure classifier read,
  through :class:`slurm_robust.health.probes.Probes` and the real ``NvmlReader``;
- ``suites``: the quick and deep health suites of a node with ``gpus_per_node`` set, so
  every GPU check (and ``deep_collective``, an all-reduce over NCCL) runs for real;
- ``nccl_init``: ``slurm_robust.train.init`` with the NCCL backend (one rank per GPU) and
  one all-reduce, as a wrapped training script would start;
- ``forked_cuda``: the launcher's fork server (launcher/node/forkserver.py) with the
  default prewarm imports torch, then forks workers that run ``train.init()`` over NCCL
  on the GPUs, as every worker of a run starts: a fork must be able to use CUDA (the
  server never touches the device), and the server must say it forks, not execs;
- ``dcgm``: ``dcgmi diag -r 1 -j`` read by slurm_robust.health.dcgm, where dcgmi is
  installed (its JSON reader was written from public references only; this is its first
  real output), the raw output kept so a layout it misreads can be fixed;
- ``determinism``: the fixed reference computation (fixed weights, input and seed, one
  forward and backward step) run in fresh processes, digests compared bit for bit: the
  bitwise test for silent data corruption is only sound if a healthy GPU repeats itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from slurm_robust.health.probes import GPU_PROBES, Probes
from slurm_robust.health.suite import run_suite
from slurm_robust.site_config import site_config_from_dict

NODE = "gpucheck"


def nvml_probes() -> dict[str, Any]:
    """Each GPU probe read once through the real NVML reader; an error is recorded, not
    raised, so one unsupported reading does not hide the others."""
    view = Probes(state_dir=None).view()
    readings: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in GPU_PROBES:
        start = time.perf_counter()
        try:
            readings[name] = {"value": view.gpu(name)[name],
                              "ms": round((time.perf_counter() - start) * 1e3, 2)}
        except Exception as exc:  # noqa: BLE001 - the check reports every failure
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
    count = readings.get("gpu_count", {}).get("value")
    return {"ok": not errors and isinstance(count, int) and count >= 1,
            "readings": readings, "errors": errors}


def health_suites_in_child(gpus: int) -> dict[str, Any]:
    """:func:`health_suites` in a fresh interpreter, run before this process touches the
    GPU: ``gpu_procs`` rightly fails a node where any process holds a CUDA context (as a
    prolog would while a previous job lingers)."""
    code = ("import json, sys; from slurm_robust_rehearsal.bench.gpu_paths import "
            f"health_suites; print(json.dumps(health_suites({int(gpus)}), default=str))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=False)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-500:]}"}


def health_suites(gpus: int) -> dict[str, Any]:
    """The prolog (quick) and epilog (deep) suites on this node, GPUs expected."""
    with tempfile.TemporaryDirectory(prefix="gpucheck-state-") as state:
        cfg = site_config_from_dict({"state_dir": f"{state}/{{node}}", "gpus_per_node": gpus,
                                     "shm_root": f"{state}/shm/{{node}}",
                                     "local_root": f"{state}/local/{{node}}"})
        out: dict[str, Any] = {}
        for stage in ("prolog", "epilog"):
            res = run_suite(stage, NODE, config=cfg, journal=False)
            gpu_results = [r for r in res.results
                           if r.check.startswith(("gpu_", "nvml_", "deep_collective"))]
            out[stage] = {
                "gpu_checks": {r.check: {"status": r.status.value, "reason": r.reason,
                                         "evidence": r.evidence,
                                         "s": round(r.duration_s, 3)} for r in gpu_results},
                "other_failures": {r.check: r.reason for r in res.results
                                   if r not in gpu_results and r.status.value == "fail"},
            }
        # A GPU check must pass (or skip with a reason) on a healthy GPU; host checks may
        # fail in a container that is not a Slurm node, so they are reported, not judged.
        out["ok"] = all(v["status"] in ("ok", "skip")
                        for stage in ("prolog", "epilog")
                        for v in out[stage]["gpu_checks"].values())
        return out


_NCCL_SCRIPT = """
import json, os, torch, torch.distributed as dist
from slurm_robust import train
run = train.init()
t = torch.full((1 << 20,), float(run.rank + 1), device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
w = run.world_size
print(json.dumps({"rank": run.rank, "backend": run.backend,
                  "exact": bool((t == w * (w + 1) / 2).all().item())}))
dist.destroy_process_group()
"""


def nccl_init(gpus: int) -> dict[str, Any]:
    """``train.init()`` as the launcher's workers call it: one process per GPU, the
    torchrun-style environment, NCCL chosen because CUDA is there. NCCL refuses two ranks
    on one device, so one GPU gives a world of two only when two are present; with one GPU
    the world is one rank whose process group is created explicitly by the same init
    (WORLD_SIZE=1 skips it in the train API, so it is forced through a world of 1)."""
    world = max(gpus, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = _NCCL_SCRIPT
    if world == 1:
        script = script.replace("run = train.init()",
                                "run = train.init()\n"
                                "dist.init_process_group('nccl', rank=0, world_size=1)")
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    ranks, errors = [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        if p.returncode == 0 and out.strip():
            ranks.append(json.loads(out.strip().splitlines()[-1]))
        else:
            errors.append(f"exit {p.returncode}: {err.strip().splitlines()[-1:]}")
    return {"ok": not errors and len(ranks) == world
            and all(r["exact"] and r["backend"] == "nccl" for r in ranks),
            "world": world, "ranks": ranks, "errors": errors}


_REFERENCE_SCRIPT = """
import hashlib, os, sys, torch
deterministic = sys.argv[1] == "1"
if deterministic:
    torch.use_deterministic_algorithms(True)
from slurm_robust_rehearsal.workloads.gpt import GPT, GPTConfig
torch.manual_seed(1234)
model = GPT(GPTConfig(n_layers=4)).cuda()
g = torch.Generator(device="cpu").manual_seed(99)
idx = torch.randint(0, 16384, (8, 257), generator=g).cuda()
logits = model(idx[:, :-1])
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                         idx[:, 1:].reshape(-1))
loss.backward()
h = hashlib.sha256()
for p in model.parameters():
    h.update(p.grad.detach().cpu().contiguous().numpy().tobytes())
print(h.hexdigest())
"""


def reference_determinism(repeats: int = 3) -> dict[str, Any]:
    """Digests of the reference forward+backward in fresh processes, with and without
    ``torch.use_deterministic_algorithms`` (plus CUBLAS_WORKSPACE_CONFIG, which cuBLAS
    needs for reproducible results)."""
    out: dict[str, Any] = {}
    for label, det in (("deterministic", "1"), ("default", "0")):
        env = {**os.environ}
        if det == "1":
            env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        digests = []
        for _ in range(repeats):
            proc = subprocess.run([sys.executable, "-c", _REFERENCE_SCRIPT, det], env=env,
                                  capture_output=True, text=True, timeout=300, check=False)
            digests.append(proc.stdout.strip() if proc.returncode == 0
                           else f"error: {proc.stderr.strip().splitlines()[-1:]}")
        out[label] = {"digests": digests,
                      "identical": len(set(digests)) == 1
                      and not digests[0].startswith("error")}
    # The bitwise SDC test's own reference step (launcher/node/reference_step.py), as the
    # workers run it at the start of a replaying attempt, on the GPU.
    code = ("from slurm_robust.launcher.node.reference_step import reference_digest; "
            "print(reference_digest('cuda'))")
    digests = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, check=False)
        digests.append(proc.stdout.strip() if proc.returncode == 0
                       else f"error: {proc.stderr.strip().splitlines()[-1:]}")
    out["bitwise_reference_step"] = {"digests": digests, "identical": len(set(digests)) == 1
                                     and not digests[0].startswith("error")}
    out["ok"] = out["deterministic"]["identical"] and \
        out["bitwise_reference_step"]["identical"]
    return out


def checksum_rates(gib: float = 2.0) -> dict[str, Any]:
    """sum64 throughput of the snapshot checksum by thread count, on a buffer the size of
    a large rank's state: the per-step checksum must keep up with the step."""
    import numpy as np

    from slurm_robust.ckpt.blob import checksum

    data = np.random.default_rng(0).integers(0, 255, int(gib * (1 << 30)), dtype=np.uint8)
    rates: dict[str, float] = {}
    values = set()
    for threads in (1, 2, 4, 8):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            values.add(checksum("sum64", data, threads))
            best = min(best, time.perf_counter() - t0)
        rates[str(threads)] = round(data.nbytes / best / 1e9, 2)
    return {"ok": len(values) == 1, "GBps_by_threads": rates, "gib": gib}


def dcgm_level1() -> dict[str, Any]:
    """DCGM's level-1 diagnostic through the project's reader; ok where dcgmi is absent
    (nothing to validate) or where every test was read with a status."""
    import shutil

    from slurm_robust.health.dcgm import parse_diag

    exe = shutil.which("dcgmi")
    if exe is None:
        return {"ok": True, "skipped": "dcgmi not installed"}
    try:
        out = subprocess.run([exe, "diag", "-r", "1", "-j"], capture_output=True, text=True,
                             timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "error": str(exc)}
    try:
        tests = parse_diag(out.stdout)
    except ValueError as exc:
        return {"ok": False, "error": str(exc), "rc": out.returncode,
                "stdout": out.stdout[-4000:], "stderr": out.stderr[-1000:]}
    return {"ok": bool(tests), "rc": out.returncode, "tests": tests,
            "stdout": out.stdout[-4000:]}


def forked_cuda(gpus: int) -> dict[str, Any]:
    """``nccl_init``'s ranks as forks of the agent's fork server (see the docstring)."""
    from slurm_robust.launcher.config import RunConfig
    from slurm_robust.launcher.node.forkserver_client import ForkServer
    from slurm_robust.launcher.node.worker_order import WorkerOrder

    world = max(gpus, 1)
    script = _NCCL_SCRIPT if world > 1 else _NCCL_SCRIPT.replace(
        "run = train.init()",
        "run = train.init()\ndist.init_process_group('nccl', rank=0, world_size=1)")
    prewarm = RunConfig.__dataclass_fields__["prewarm"].default
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        path = os.path.join(tmp, "nccl_rank.py")
        with open(path, "w") as fh:
            fh.write(script)
        server = ForkServer([sys.executable, path], tuple(prewarm), dict(os.environ))
        server.start()
        t0 = time.time()
        procs = []
        for rank in range(world):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
            procs.append(server.spawn(WorkerOrder([path], env, tmp,
                                                  os.path.join(tmp, f"rank{rank}.log"))))
        codes = [p.wait(180) if p is not None else None for p in procs]
        ready_s = None if server.ready_at is None else round(server.ready_at - t0, 2)
        mode = server.mode
        server.close()
        ranks, errors = [], []
        for rank, code in enumerate(codes):
            with open(os.path.join(tmp, f"rank{rank}.log")) as fh:
                lines = fh.read().strip().splitlines()
            if code == 0 and lines:
                ranks.append(json.loads(lines[-1]))
            else:
                errors.append(f"rank {rank} exit {code}: {lines[-3:]}")
    return {"ok": not errors and len(ranks) == world and mode == "fork"
            and all(r["exact"] and r["backend"] == "nccl" for r in ranks),
            "world": world, "server_ready_s": ready_s, "mode": mode, "ranks": ranks,
            "errors": errors}


def run_all(gpus: int) -> dict[str, Any]:
    result = {"nvml": nvml_probes(), "suites": health_suites_in_child(gpus),
              "checksum": checksum_rates(), "dcgm": dcgm_level1(),
              "nccl_init": nccl_init(gpus), "forked_cuda": forked_cuda(gpus),
              "determinism": reference_determinism()}
    result["ok"] = all(v.get("ok") for v in result.values())
    return result


if __name__ == "__main__":
    import torch

    print(json.dumps(run_all(torch.cuda.device_count()), indent=2, default=str))
