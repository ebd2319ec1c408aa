"""Can the mini-cluster run a job at all, and if not, why not.

A cluster whose nodes all fail their prolog (a check that fails on this machine, a full
/tmp) or never start a job looks, test by test, like dozens of unrelated failures, each
waiting out its own timeout: one CI run spent its whole 90 minutes that way and printed
nothing that said why. ``smoke`` runs one trivial job on every node; ``diagnosis`` says
what the cluster looks like (daemons, nodes that take no jobs and their reasons, the last
verdicts, slurmctld's last errors) in a few lines that fit a CI log.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

SMOKE_TIMEOUT_S = 180.0  # the prolog's quick suite on every node of a slow machine
SMOKE_SCRIPT = "#!/bin/sh\nexit 0\n"


def smoke(cluster: Any, timeout_s: float = SMOKE_TIMEOUT_S) -> list[str]:
    """One trivial job per node (as root, each pinned to its node); what went wrong, per
    node, or ``[]`` when every job completed. Leftover jobs are cancelled."""
    s = cluster.slurm
    ids: dict[str, str] = {}
    problems: list[str] = []
    for node in cluster.cfg.nodes:
        try:
            ids[node] = s.sbatch(["-N", "1", "-w", node, "-p", "train,standby", "-J",
                                  "smoke", "-o", "/dev/null", "-t", "5"], script=SMOKE_SCRIPT)
        except Exception as exc:  # noqa: BLE001 -- reported, not raised: it is the finding
            problems.append(f"{node}: sbatch failed: {exc}")
    # One squeue per poll for all of them; finished jobs stay listed for MinJobAge (300 s).
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {j.job_id: j for j in s.jobs(ids.values())}
        if all(j.finished for j in jobs.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for node, job_id in ids.items():
        job = jobs.get(job_id)
        if job is None or job.state == "COMPLETED":
            continue
        if job.finished:
            problems.append(f"{node}: job {job_id} {job.state} (exit {job.exit_code})")
            continue
        problems.append(f"{node}: job {job_id} still {job.state} ({job.state_reason}) "
                        f"after {timeout_s:g} s")
        try:
            s.cancel(job_id)
        except Exception:  # noqa: BLE001,S110 -- best effort; the finding is reported above
            pass
    return problems


def _tail(path: Path, lines: int, containing: str = "") -> list[str]:
    try:
        with path.open(errors="replace") as fh:
            return list(deque((ln.rstrip() for ln in fh if containing in ln), maxlen=lines))
    except FileNotFoundError:
        return []  # nothing written yet (no verdict, no failing check)
    except OSError as exc:
        return [f"({path}: {exc.strerror})"]


def _fields(line: str, keys: tuple[str, ...]) -> str:
    try:
        rec = json.loads(line)
    except ValueError:
        return line[:300]
    return " ".join(f"{k}={rec.get(k)!s:.200}" for k in keys)


def diagnosis(cluster: Any, mc: Any = None) -> str:
    """The cluster's state in a few lines: stopped daemons, nodes that take no job and
    why, the jobs still in the queue and why they wait, the last verdicts (they name the
    check), slurmctld's last errors and the jobs it ended because a node refused them."""
    out: list[str] = []
    if mc is not None:
        stopped = [name for name, pid in mc.running().items() if not pid]
        out.append("daemons stopped: " + (", ".join(stopped) if stopped else "none"))
    try:
        bad = [n for n in cluster.slurm.nodes() if not n.usable]
        out.append("nodes not taking jobs: " + ("; ".join(
            f"{n.name} {n.state}{'+' + '+'.join(sorted(n.flags)) if n.flags else ''}"
            f" {n.reason!r}" for n in bad) if bad else "none"))
    except Exception as exc:  # noqa: BLE001 -- slurmctld not answering is itself the finding
        out.append(f"sinfo failed: {exc}")
    try:
        queued = [j for j in cluster.slurm.jobs() if not j.finished]
        out.append("jobs in the queue: " + ("; ".join(
            f"{j.job_id} {j.state} {j.state_reason or '-'} restarts={j.restart_count}"
            f" nodes={','.join(j.nodes) or '-'}" for j in queued[:10]) if queued else "none"))
    except Exception as exc:  # noqa: BLE001 -- as above
        out.append(f"squeue failed: {exc}")
    log_dir = Path(cluster.cfg.log_dir)
    for line in _tail(log_dir / "verdicts.jsonl", 3):
        out.append("verdict: " + _fields(line, ("node", "action", "reason")))
    # The node-side health records name the failing check and what it read.
    for path in sorted(Path(cluster.cfg.root).glob("nodes/*/state/health/*.jsonl")):
        failed = _tail(path, 1, '"status":"fail"')
        if failed:
            out.append("health: " + _fields(failed[0], ("node", "stage", "check", "reason")))
    for line in _tail(log_dir / "slurmctld.log", 5, "error"):
        out.append(f"slurmctld: {line[:300]}")
    # An info line, not an error: a launch a slurmd refused ends the job for good.
    for line in _tail(log_dir / "slurmctld.log", 3, "non-startable"):
        out.append(f"slurmctld: {line[:300]}")
    return "\n".join(out)
