"""Start, watch and stop the training workers of one node.

Workers get torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, GROUP_WORLD_SIZE, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
TORCHELASTIC_USE_AGENT_STORE=False, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless set, and,
as torchrun does with more than one process per node, OMP_NUM_THREADS=1 unless set),
Slurm's own (SLURM_RESTART_COUNT and the rest, passed through), plus the robust one:

    SLURM_ROBUST_ATTEMPT    the attempt number (one count across in-job restarts and requeues)
    SLURM_ROBUST_RESTART_COUNT  the same count (restarts so far: 0 on the first start)
    SLURM_ROBUST_RUN_DIR    the run directory
    SLURM_ROBUST_PROGRESS   this worker's progress channel (a JSON-lines file, node-local)
    SLURM_ROBUST_NODE       the Slurm node name
    SLURM_ROBUST_JOB_ID     the job id (checkpoint paths carry it)
    SLURM_ROBUST_CKPT       JSON: checkpoint tiers for slurm_robust.ckpt.CheckpointConfig
    SLURM_ROBUST_RANK_NODES JSON: the node of every rank, as compact runs
                            ([["node[0001-0004]", 8]]; train.rank_nodes_from_env reads it)

Workers stay in the agent's process group, so Slurm's own cleanup (scancel, requeue)
reaches them. Their stdout and stderr go to
``<run_dir>/logs/attempt<a>/gen<g>/rank<r>.log`` (a new file per attempt); the
tail of that file is the evidence a failure is classified from.

The progress channel: the training API appends one JSON line per finished step
(``{"step", "loss", "grad_norm", "t"}``, plus ``busy_s`` when the script times its own
compute with ``run.busy()``: the input of fail-slow detection) and a few lifecycle lines
(``restored``, ``final``, ``anomaly``). Appending to a node-local tmpfs file costs
microseconds, does not block on the agent, and survives the worker's crash for the
agent to read.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.ckpt import CheckpointConfig
from slurm_robust.launcher import rank_map
from slurm_robust.launcher.messages import Plan
from slurm_robust.launcher.node.forkserver_client import ForkServer, ServedProcess
from slurm_robust.launcher.node.worker_order import WorkerOrder
from slurm_robust.launcher.worker_signals import DRAIN_SIGNAL
from slurm_robust.stacks import procfs

TAIL_BYTES = 32768


@dataclass
class Worker:
    """One running (or exited) worker process."""

    rank: int
    local_rank: int
    gen: int
    #: A plain child, or a fork of the agent's fork server (forkserver_client.py).
    popen: subprocess.Popen[bytes] | ServedProcess
    log_path: Path
    progress_path: Path
    started: float
    offset: int = 0
    partial: bytes = b""
    exit_time: float | None = None
    reported: bool = False

    @property
    def pid(self) -> int | None:
        """None while the fork server has not started it yet (pending)."""
        return self.popen.pid


def worker_env(base: Mapping[str, str], plan: Plan, rank: int, local_rank: int,
               node: str, job_id: str, run_dir: str, progress: Path,
               ckpt: CheckpointConfig, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of one worker (see the module docstring). ``plan``: an active
    plan (its rendezvous fields are set: Plan.validate refuses one that lacks them)."""
    ranks = plan.ranks or []
    env = dict(base)
    env.update(extra)
    world = int(plan.world_size or 0)
    # torchrun's rule (torch.distributed.run): one OpenMP thread per process when a node
    # runs several, unless the user chose; N processes x all cores oversubscribe a node.
    if len(ranks) > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = "1"
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(len(ranks)),
        "GROUP_RANK": str(plan.slot), "GROUP_WORLD_SIZE": str(world // max(1, len(ranks))),
        "ROLE_NAME": "default", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": str(plan.master_addr), "MASTER_PORT": str(plan.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(plan.attempt),
        "TORCHELASTIC_MAX_RESTARTS": str(plan.max_restarts or 0),
        "TORCHELASTIC_RUN_ID": str(plan.run_id or ""),
        # No torchelastic agent store here: init_process_group uses MASTER_ADDR/PORT.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "SLURM_ROBUST_ATTEMPT": str(plan.attempt),
        "SLURM_ROBUST_RESTART_COUNT": str(plan.attempt),
        "SLURM_ROBUST_RUN_DIR": run_dir,
        "SLURM_ROBUST_PROGRESS": str(progress),
        "SLURM_ROBUST_NODE": node,
        "SLURM_ROBUST_JOB_ID": job_id,
        # Runs, not a name per rank: 32,768 names are past Linux's 128 KiB limit for one
        # environment string, and execve would refuse every worker (launcher/rank_map.py).
        "SLURM_ROBUST_RANK_NODES": json.dumps(
            None if plan.rank_nodes is None else rank_map.encode(plan.rank_nodes),
            separators=(",", ":")),
        "PYTHONUNBUFFERED": "1",
        **ckpt.to_env(),
    })
    return env


def spawn(command: list[str] | tuple[str, ...], env: dict[str, str], rank: int,
          local_rank: int, gen: int, log_path: Path, progress: Path,
          server: ForkServer | None = None) -> Worker:
    """Start one worker (a fork of ``server`` when it is usable); its output goes to
    ``log_path`` (created)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    progress.parent.mkdir(parents=True, exist_ok=True)
    progress.unlink(missing_ok=True)
    progress.touch()
    if server is not None:
        served = server.spawn(WorkerOrder(list(command[1:]), env, os.getcwd(),
                                          str(log_path)))
        if served is not None:
            return Worker(rank, local_rank, gen, served, log_path, progress, time.time())
    # 0600, not a link: a worker's output can hold anything the training code prints.
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o600)
    try:
        popen = subprocess.Popen(list(command), env=env, stdout=log_fd,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        os.close(log_fd)
    return Worker(rank, local_rank, gen, popen, log_path, progress, time.time())


def exit_status(returncode: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a Popen return code."""
    return (None, -returncode) if returncode < 0 else (returncode, None)


# open-ended: the training script's own lines, checked afterwards (messages.Progress)
def read_progress(worker: Worker) -> list[dict[str, Any]]:
    """New complete lines of the worker's progress channel since the last call."""
    try:
        with open(worker.progress_path, "rb") as fh:
            fh.seek(worker.offset)
            data = fh.read()
    except FileNotFoundError:
        return []
    worker.offset += len(data)
    data = worker.partial + data
    lines = data.split(b"\n")
    worker.partial = lines.pop()
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue  # a torn line of a killed writer; the next line is whole again
        if isinstance(obj, dict):
            obj["rank"] = worker.rank
            out.append(obj)
    return out


def log_tail(path: Path, nbytes: int = TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, D, T stopped, Z), None when gone."""
    stat = procfs.read_stat(pid)
    return stat[1][0] if stat is not None and stat[1] else None


def wait_for_exit(workers: Sequence[Worker], timeout_s: float,
                  wake_fd: int | None = None, server: ForkServer | None = None) -> None:
    """Sleep up to ``timeout_s``, but return as soon as one of ``workers`` exits, or
    ``wake_fd`` (the controller channel's socket) turns readable, or the fork ``server``
    has news (a pending worker started, an exit's status).

    The agent reports between these waits; waking on the exit itself (a pidfd turns
    readable when its process ends, zombie included) lets a dead worker's report leave at
    once instead of up to a heartbeat later, and waking on the channel lets the
    controller's push of a changed plan (protocol.py) reach it at once. A pid here cannot
    have been reused: the agent reaps its plain children only in ``poll``, and the fork
    server reaps its forks only when the agent has their status. Without pidfd_open
    (Linux < 5.3, or a seccomp filter that refuses it) only the channels are watched."""
    if any(w.popen.returncode is not None for w in workers):
        return  # already reaped: nothing to wait for, the next report carries it
    if server is not None:
        server.pump()  # take what it has already said: its pipe then wakes only on news
    fds: list[int] = []
    try:
        for w in workers:
            if w.pid is None:
                continue  # pending: the server's "started" event wakes us
            try:
                fds.append(os.pidfd_open(w.pid))
            except ProcessLookupError:
                return  # gone already
            except (AttributeError, OSError):
                # No pidfds here, or no descriptor left (EMFILE): the channels alone, or
                # a plain sleep; the next report still sees the exit.
                break
        channels = [wake_fd, server.fileno() if server is not None else None]
        watched = fds + [fd for fd in channels if fd is not None and fd >= 0]
        if watched:
            # poll(2), not select(2): select refuses descriptors above FD_SETSIZE (1024),
            # which a busy agent (workers' pipes, the controller's connections) reaches;
            # and unlike epoll it needs no descriptor of its own, so it works at EMFILE.
            poller = select.poll()
            for fd in watched:
                poller.register(fd, select.POLLIN)
            poller.poll(max(0.0, timeout_s) * 1000.0)
        else:
            time.sleep(timeout_s)
    finally:
        for fd in fds:
            os.close(fd)


def stop_workers(workers: list[Worker], grace_s: float, drain_s: float = 0.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL what is left, and reap everything.

    A stopped (SIGSTOP) worker cannot act on SIGTERM; SIGKILL still ends it. With
    ``drain_s`` (a generation that ends by choice) the workers that handle
    DRAIN_SIGNAL get it first and up to ``drain_s`` to finish their snapshots and end.
    """
    if drain_s > 0:
        _drain(workers, drain_s)
    alive = [w for w in workers if w.popen.poll() is None]
    for w in alive:
        w.popen.send_signal(signal.SIGTERM)
        w.popen.send_signal(signal.SIGCONT)
    _wait_gone(alive, grace_s)
    for w in alive:
        if w.popen.poll() is None:
            w.popen.send_signal(signal.SIGKILL)
    for w in alive:
        try:
            w.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel (D state); nothing more a user process can do


def _drain(workers: list[Worker], drain_s: float) -> None:
    """DRAIN_SIGNAL to the workers that handle it (a plain script would ignore it, but
    one that does not handle it gains nothing from the wait), then wait for their exit."""
    draining = [w for w in workers if w.popen.poll() is None and w.pid is not None
                and procfs.catches_signal(w.pid, DRAIN_SIGNAL)]
    for w in draining:
        w.popen.send_signal(DRAIN_SIGNAL)
    _wait_gone(draining, drain_s)


def _wait_gone(workers: list[Worker], timeout_s: float) -> None:
    """Return when every one of ``workers`` has exited, or after ``timeout_s``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        left = [w for w in workers if w.popen.poll() is None]
        if not left:
            return
        # Woken by the exit itself (pidfds), not a fixed poll: a restart waits on this.
        wait_for_exit(left, min(0.02, max(0.0, deadline - time.time())))

