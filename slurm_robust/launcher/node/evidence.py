"""Gather everything the classifier can use about one failed worker on this node.

The agent calls :func:`gather` when a worker exits non-zero and hands the result to
``slurm_robust.launcher.classify.classify``:

- the exit code or signal the agent saw, and the tail of the worker's log;
- the trusted ``slurm_robust.task_exit`` record (docs/SCHEMAS.md) for that process when
  the SPANK plugin wrote one: matched by job id and pid, read from the end of the node's
  journal only (bounded), never written. Under the launcher the workers are the agent's
  children, not Slurm tasks, so a record exists only where a worker is itself a task;
- the node's kernel log (Xid lines, panics, I/O errors, the OOM killer): the records of
  ``/dev/kmsg`` logged since the worker started, through the health layer's reader (none
  in a container without access);
- NVML evidence through this node's probes (injections first, as the prolog sees them).
  The probes are built *without* the Xid cursor: reading here must not consume the Xids
  the next health check or stop-time diagnosis has to see.

Every source is best effort: a missing or unreadable one is left out, and the reason is
kept in ``skipped`` so the incident shows what was not consulted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from slurm_robust.health.nvml import read_kmsg
from slurm_robust.health.probes import Probes, enabled_injections
from slurm_robust.launcher.classify import Evidence, nvml_evidence
from slurm_robust.launcher.wire_records import NvmlReadings, TaskExitRecord
from slurm_robust.site_config import SiteConfig

#: Bytes read from the end of the task-exit journal (a few hundred records).
TASK_EXIT_TAIL_BYTES = 64 * 1024
#: Kernel records kept (the newest; the failure is recent).
KERNEL_LINES = 400
TASK_EXIT_FILE = "task_exit.jsonl"
#: The SPANK plugin's default journal (spank/README.md, ``journal=``).
DEFAULT_TASK_EXIT_JOURNAL = "/var/lib/slurm_robust/task_exit.jsonl"


@dataclass
class Gathered:
    evidence: Evidence
    skipped: dict[str, str] = field(default_factory=dict)


def task_exit_journals(site: SiteConfig, node: str) -> list[Path]:
    """Where this node's task-exit journal may be: in the node's state directory (the
    mini-cluster's plugstack ``journal=`` argument), then the plugin's default."""
    return [site.state_path(node) / TASK_EXIT_FILE, Path(DEFAULT_TASK_EXIT_JOURNAL)]


def find_task_exit(paths: list[Path], job_id: str, pid: int,
                   tail_bytes: int = TASK_EXIT_TAIL_BYTES) -> TaskExitRecord | None:
    """The newest ``slurm_robust.task_exit`` record of ``job_id`` with ``pid``, read from
    the last ``tail_bytes`` of each journal; None when there is none."""
    for path in paths:
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(max(0, size - tail_bytes))
                data = fh.read(tail_bytes)
        except OSError:
            continue
        lines = data.decode(errors="replace").splitlines()
        if size > tail_bytes and lines:
            lines = lines[1:]  # the first line may be cut
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or rec.get("schema") != "slurm_robust.task_exit":
                continue
            if str(rec.get("job_id")) == str(job_id) and rec.get("pid") == pid:
                return rec
    return None


def kernel_lines(since_monotonic: float | None, limit: int = KERNEL_LINES) -> list[str]:
    """The message text of the newest kernel records (``pri,seq,usec,flags;text``) logged
    at or after ``since_monotonic`` (seconds on the kernel's clock, which is
    CLOCK_MONOTONIC): an old I/O error in the ring buffer must not explain a new crash."""
    out = []
    for rec in read_kmsg():
        head, _, text = rec.partition(";")
        parts = head.split(",")
        if since_monotonic is not None:
            try:
                if int(parts[2]) / 1e6 < since_monotonic:
                    continue
            except (IndexError, ValueError):
                continue
        if text:
            out.append(text)
    return out[-limit:]


def gather(*, site: SiteConfig, node: str, job_id: str, pid: int, exit_code: int | None,
           sig: int | None, log_tail: str, since_monotonic: float | None,
           expected_gpus: int | None = None,
           probes: Probes | None = None,
           kernel: list[str] | None = None) -> Gathered:
    """All the evidence about one failed worker (see the module docstring)."""
    skipped: dict[str, str] = {}
    record = find_task_exit(task_exit_journals(site, node), job_id, pid)
    if record is None:
        skipped["task_exit"] = "no record for this pid (workers are not Slurm tasks)"
    if kernel is None:
        try:
            kernel = kernel_lines(since_monotonic)
        except OSError as exc:
            kernel = []
            skipped["kernel_log"] = f"kernel log not readable: {exc.strerror or exc}"
    nvml: NvmlReadings = {}
    try:
        if probes is None:
            probes = Probes(enabled_injections(site.state_path(node), site.injection_enabled),
                            state_dir=None)
        nvml = nvml_evidence(probes.view())
    except Exception as exc:  # noqa: BLE001 - evidence is best effort, never a blocker
        skipped["nvml"] = f"{type(exc).__name__}: {exc}"[:200]
    if not nvml and "nvml" not in skipped:
        skipped["nvml"] = "no NVML on this node and nothing injected"
    ev = Evidence(exit_code=exit_code, signal=sig, log_tail=log_tail, task_exit=record,
                  kernel_log=tuple(kernel), nvml=nvml,
                  expected_gpus=expected_gpus if expected_gpus is not None
                  else site.gpus_per_node)
    return Gathered(ev, skipped)
