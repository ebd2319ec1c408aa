"""Small helpers shared by the integration tests (polling, shared output directories)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from slurm_robust_rehearsal.bench.reference import standalone_params_digest
from slurm_robust_rehearsal.inject.job import spare_path_victim as spare_path_victim
from tests.reference_cache import argv_key, cached

T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T], timeout_s: float = 60.0,
               interval_s: float = 0.3) -> T:
    """Poll ``probe`` until it returns something true and return that; fail after timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def shared_out_dir(cluster: Any, name: str) -> Path:
    """A directory on the mini-cluster's shared storage that every user's job can write."""
    path = cluster.cfg.shared_dir / "tests" / name
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    return path


def standalone_digest(argv: list[str], world: int, timeout_s: float = 300.0,
                      env_extra: Callable[[int], dict[str, str]] | None = None,
                      drop_env: tuple[str, ...] = ("SLURM_ROBUST_PROGRESS",
                                                   "SLURM_ROBUST_RUN_DIR")) -> str:
    """The fault-free reference: ``argv`` run standalone as ``world`` ranks with torchrun's
    variables (no Slurm, no launcher); returns rank 0's ``params_sha256=`` digest.
    ``env_extra(rank)``: more variables for that rank.

    A rank that exited non-zero fails the reference (except gloo's teardown abort after
    rank 0 printed its digest). Computed once per session for each distinct command,
    world and environment (tests/reference_cache.py); the run itself is the rehearsal's
    (slurm_robust_rehearsal/bench/reference.py), which the benchmarks use too.
    """
    extra = tuple(tuple(sorted((env_extra(r) if env_extra else {}).items()))
                  for r in range(world))
    key = (argv_key(argv), world, extra, tuple(sorted(drop_env)))
    return cached(key, lambda: standalone_params_digest(argv, world, timeout_s,
                                                   env_extra, drop_env))


def run_diagnostics(run_dir: str | Path, job_id: str | None = None, lines: int = 6) -> str:
    """What a stalled run's files and processes show, for a failure message: the agents'
    log tails, each newest rank log's tail, and the processes of the job's step (a hang
    that only a loaded CI machine shows is then readable from its output alone)."""
    run = Path(run_dir)
    parts: list[str] = []
    for log in sorted((run / "submitit").glob("*_log.out")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name}\n" + "\n".join(t[:240] for t in tail))
    for agent in sorted((run / "agents").glob("*.json")):
        parts.append(f"--- agents/{agent.name}: {agent.read_text(errors='replace')[:300]}"
                     .replace("\n", " "))
    gens = sorted((run / "logs").glob("attempt*/gen*"), key=lambda p: p.stat().st_mtime)
    for rank_log in sorted(gens[-1].glob("rank*.log")) if gens else []:
        tail = rank_log.read_text(errors="replace").splitlines()[-3:]
        parts.append(f"--- {gens[-1].parent.name}/{gens[-1].name}/{rank_log.name}\n"
                     + "\n".join(t[:240] for t in tail))
    try:
        ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,pcpu,etimes,wchan:24,args"],
                            capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        ps = [f"ps failed: {exc}"]
    # The step's processes: those that name the run (agents), and their descendants.
    rows = {int(r.split()[0]): r for r in ps[1:] if r.split() and r.split()[0].isdigit()}
    parent = {pid: int(r.split()[1]) for pid, r in rows.items()}
    keep = {pid for pid, r in rows.items() if str(run) in r
            or (job_id is not None and f"slurmstepd: [{job_id}" in r)}
    changed = True
    while changed:
        grown = {pid for pid, pp in parent.items() if pp in keep} - keep
        keep |= grown
        changed = bool(grown)
    parts.append("--- processes\n" + "\n".join([ps[0] if ps else ""] +
                                               [rows[p][:240] for p in sorted(keep)]))
    return "\n".join(parts)
