"""Capture the stacks of a whole run: every node's workers, found in the run directory.

The launcher's agents publish ``<run_dir>/agents/<node>.json`` as
``{"node": NODE, "workers": {"<rank>": <pid>, ...}, ...}``. A node whose worker pids
live on this machine (the mini-cluster runs every node on localhost) is captured
directly; any other node is captured by running ``slurm-robust stacks capture
--local-only`` there through ``srun --jobid J --overlap -w NODE`` (needs the job id).
All nodes write into one capture directory, ``<run_dir>/stacks/<capture_id>/``.

A pid is taken as this node's when it exists here and its environment's
``SLURMD_NODENAME`` (when readable) names the node, so a pid that merely exists on
another host by coincidence is not dumped in its place. The agent files are written
by the job, so they are not trusted further than that: with a job id, a pid must carry
that ``SLURM_JOB_ID``; run as root, a pid must belong to the owner of its agent file
(else a job could have root dump, or signal, anyone's process); the capture id is a
plain name and the capture directory must stay inside the run directory.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError, UsageError
from slurm_robust.run_dir_trust import read_trusted_json, run_dir_owner
from slurm_robust.secure_fs import UnsafePathError
from slurm_robust.slurm import RetryPolicy, check_job_id, check_node_name, run_slurm_command
from slurm_robust.stacks import procfs
from slurm_robust.stacks.capture import CaptureOptions, capture_local, new_capture_id
from slurm_robust.stacks.handler import DEFAULT_TEMPLATE

# Slack on top of the capture budget for srun to start the remote step.
SRUN_SLACK_S = 30.0
_CAPTURE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@dataclass(frozen=True)
class NodeCapture:
    """How one node was captured: ``local``, ``srun`` or ``skipped`` (with why)."""

    node: str
    how: str
    ranks: tuple[int, ...]
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "how": self.how, "ranks": list(self.ranks),
                "error": self.error}


@dataclass(frozen=True)
class AgentFile:
    node: str
    workers: dict[int, int]
    owner_uid: int


def read_agent_files(run_dir: str | os.PathLike[str]) -> dict[str, AgentFile]:
    """The published agent files of a run, by node.

    The pids they list are signalled, so each file must be the run directory owner's
    (root trusts a directory named to it as its owner's), a regular file, not a link and
    not writable by others (slurm_robust/run_dir_trust.py).

    Raises UsageError when there is no agents directory or a file is malformed or
    untrusted.
    """
    agents = Path(run_dir) / "agents"
    if not agents.is_dir():
        raise UsageError(f"no {agents}: is {run_dir} the run directory of a started run?")
    owner = run_dir_owner(run_dir)
    out: dict[str, AgentFile] = {}
    for path in sorted(agents.glob("*.json")):
        try:
            obj = read_trusted_json(path, owner)
            node = str(obj.get("node") or path.stem)
            workers = {int(r): int(p) for r, p in (obj.get("workers") or {}).items()}
            out[node] = AgentFile(node, workers, owner)
        except (OSError, ValueError, AttributeError, TypeError, UnsafePathError) as exc:
            raise UsageError(f"cannot read agent file {path}: {exc}") from exc
    return out


def local_workers(node: str, workers: Mapping[int, int], job_id: str | None = None,
                  owner_uid: int | None = None) -> dict[int, int]:
    """The workers of ``node`` whose pids are this machine's (see the module doc).

    ``job_id``: the pid's SLURM_JOB_ID must match it. ``owner_uid``: the pid must
    belong to that user (checked when this process runs as root).
    """
    mine = {}
    for rank, pid in workers.items():
        if not procfs.exists(pid):
            continue
        seen = procfs.environ_value(pid, "SLURMD_NODENAME")
        if seen is not None and seen != node:
            continue
        if job_id is not None and procfs.environ_value(pid, "SLURM_JOB_ID") != job_id:
            continue
        if owner_uid is not None and os.geteuid() == 0 and procfs.owner_uid(pid) != owner_uid:
            continue
        mine[rank] = pid
    return mine


def capture_run(run_dir: str | os.PathLike[str], options: CaptureOptions | None = None,
                capture_id: str | None = None, nodes: list[str] | None = None,
                job_id: str | None = None, local_only: bool = False,
                force_srun: bool = False,
                slurm_env: Mapping[str, str] | None = None) -> tuple[Path, list[NodeCapture]]:
    """Capture every node of a run (or only ``nodes``); returns the capture directory
    and what happened on each node.

    Nodes whose workers are not on this machine go through srun when ``job_id`` is
    given and ``local_only`` is false; otherwise they are reported as skipped.
    ``force_srun`` sends every node through srun (on the mini-cluster all nodes share
    one host, so this is how the srun path is exercised there).
    """
    if force_srun and (job_id is None or local_only):
        raise UsageError("capture through srun needs the job id and not local_only")
    run_dir = Path(run_dir)
    agents = read_agent_files(run_dir)
    if nodes:
        unknown = sorted(set(nodes) - set(agents))
        if unknown:
            raise UsageError(f"nodes {unknown} have no agent file in {run_dir}/agents "
                             f"(known: {sorted(agents)})")
        agents = {n: agents[n] for n in nodes}
    if not agents:
        raise UsageError(f"no agent files in {run_dir}/agents: the run has not started")
    options = options or CaptureOptions()
    if options.faulthandler_template is None:
        options = replace(options, faulthandler_template=str(run_dir / DEFAULT_TEMPLATE))
    capture_id = capture_id or new_capture_id()
    if not _CAPTURE_ID.match(capture_id):
        raise UsageError(f"capture id {capture_id!r} must be a plain name "
                         "(letters, digits, '.', '_', '-')")
    out = run_dir / "stacks" / capture_id
    if not out.resolve().is_relative_to(run_dir.resolve()):
        raise UsageError(f"{out} leads outside the run directory {run_dir} (a symlink?)")

    def one(agent: AgentFile) -> NodeCapture:
        return _capture_node(agent, out, options, capture_id, run_dir, job_id,
                             local_only, force_srun, slurm_env)

    with ThreadPoolExecutor(max_workers=min(8, len(agents))) as pool:
        results = list(pool.map(one, [agents[n] for n in sorted(agents)]))
    return out, results


def _capture_node(agent: AgentFile, out: Path, options: CaptureOptions, capture_id: str,
                  run_dir: Path, job_id: str | None, local_only: bool, force_srun: bool,
                  slurm_env: Mapping[str, str] | None) -> NodeCapture:
    node, workers = agent.node, agent.workers
    ranks = tuple(sorted(workers))
    if not workers:
        return NodeCapture(node, "skipped", ranks, "no workers (a parked spare)")
    mine = {} if force_srun else local_workers(node, workers, job_id, agent.owner_uid)
    if mine:
        result = capture_local(mine, node, out, options, capture_id)
        missing = sorted(set(workers) - set(mine))
        error = f"pids of ranks {missing} not found here" if missing else None
        return NodeCapture(node, "local", tuple(d.rank for d in result.dumps), error)
    if job_id is None or local_only:
        why = "local only" if local_only else "pass the job id to capture through srun"
        return NodeCapture(node, "skipped", ranks,
                           f"no worker pid of this node (and job) found here; {why}")
    try:
        remote = _srun_capture(node, job_id, run_dir, capture_id, options, slurm_env)
    except SlurmRobustError as exc:
        return NodeCapture(node, "srun", ranks, str(exc))
    # The remote side reports what it did on its node (local there, or skipped).
    error = remote.get("error")
    if remote.get("how") != "local":
        error = error or f"remote capture did not run locally: {remote}"
    return NodeCapture(node, "srun", tuple(remote.get("ranks") or ()), error)


def _srun_capture(node: str, job_id: str, run_dir: Path, capture_id: str,
                  options: CaptureOptions,
                  slurm_env: Mapping[str, str] | None) -> dict[str, Any]:
    """Run the capture of ``node`` there; returns its NodeCapture as JSON."""

    argv = ["srun", "--jobid", check_job_id(job_id), "--overlap", "-N1", "-n1",
            "-w", check_node_name(node), "--quiet",
            sys.executable, "-m", "slurm_robust.cli.main", "stacks", "capture",
            "--run-dir", str(run_dir), "--node", node, "--capture-id", capture_id,
            "--job", check_job_id(job_id), "--local-only", "--json", "--method", options.method,
            "--budget-s", str(options.budget_s)]
    if options.native:
        argv.append("--native")
    policy = RetryPolicy(attempts=1, timeout_s=options.budget_s + SRUN_SLACK_S)
    out = run_slurm_command(argv, policy=policy, env=slurm_env).stdout
    try:
        nodes = json.loads(out.strip().splitlines()[-1])["nodes"]
        return next(n for n in nodes if n.get("node") == node)
    except (ValueError, KeyError, IndexError, StopIteration, TypeError) as exc:
        raise SlurmRobustError(f"capture on {node} through srun printed no report "
                               f"({exc!r}); output: {out[-300:]!r}") from exc
