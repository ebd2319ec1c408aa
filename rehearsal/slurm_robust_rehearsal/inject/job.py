"""Fault injection into a running robust job: real signals on real processes.

Targets come from the run's published agent files (``<run_dir>/agents/<node>.json``),
and every pid is checked against the process's own environment (it must carry the
job's id) before it is signalled, so a stale file never hits an unrelated process.

=============  ===================================================================
kill-worker    SIGKILL one worker
stop-worker    SIGSTOP one worker (a hang; the launcher's SIGKILL still ends it)
nan            SIGUSR1 one worker: slurm_robust.train poisons a parameter with NaN
               after the next snapshot, so the following step's loss is NaN
slow-worker    SIGSTOP/SIGCONT duty cycle on one worker for ``duration`` seconds
               (``slowdown`` 2: half of every ``period`` stopped, about half as fast)
kill-node      mini-cluster only: SIGKILL the node's slurmd, every process of the job
               on that node (its slurmstepds, the agent, the workers), and wipe the
               node's shared-memory and local checkpoint directories of the job
sdc            silent data corruption on one node (nan_faults.py); ``nan --mode data``
               is a poisoned sample that returns on every replay (nan_faults.py)
=============  ===================================================================

Each injection is recorded in ``<run_dir>/inject/<time>-<fault>.json`` (its time is the
fault time the tests measure recovery from).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

from slurm_robust.launcher.errors import InjectionError
from slurm_robust.launcher.paths import CLUSTER_DIR_ENV, RunPaths, load_site
from slurm_robust.launcher.submit.status import job_run
from slurm_robust.run_dir_trust import write_json_as_owner
from slurm_robust.slurm import Slurm, SlurmCommandError
from slurm_robust.stacks import procfs
from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.cluster.manager import MiniCluster

FAULTS = ("kill-worker", "stop-worker", "nan", "kill-node", "slow-worker", "sdc")


def spare_path_victim(state: Any, controller: str) -> str:
    """An active node whose loss the in-job spare takes: neither the controller's node
    (failover) nor the batch node (agent 0's: losing it ends the job in Slurm's eyes, the
    requeue rung). ``state``: the run's state.json as loaded by load_state."""
    return next(n for n in state.slots if n not in (controller, state.members.get("0")))


def pick_worker(run_dir: str, node: str | None, rank: int | None,
                job_id: str | None = None, owner: int | None = None) -> tuple[str, int, int]:
    """(node, rank, pid) of the worker to hit: the given rank and/or node, else the
    highest rank. Only live processes of ``job_id`` count (the agent file of a lost
    node still lists its dead workers), and only agent files of ``owner``, the job's
    user (RunPaths.read_agents)."""
    agents = RunPaths.of(run_dir).read_agents(owner)
    found = [(n, int(r), int(p)) for n, a in agents.items()
             for r, p in (a.get("workers") or {}).items()]
    if job_id is not None:
        listed = [f for f in found if (rank is None or f[1] == rank)
                  and (node is None or f[0] == node)]
        found = [f for f in found if _belongs(f[2], job_id)]
        if listed and not [f for f in found if f in listed]:
            # The pids are checked and signalled on this host only: on a cluster of
            # several hosts the usual cause is running inject away from the worker.
            where = listed[0][0]
            raise InjectionError(
                f"none of the {len(listed)} matching worker(s) listed in {run_dir}/agents is "
                f"a live process of job {job_id} on this host ({socket.gethostname()}): "
                "inject signals processes where it runs, so run it on the worker's node "
                f"(srun --overlap --jobid {job_id} -w {where} slurm-robust inject ...), "
                "or the workers are restarting: retry in a moment")
    if rank is not None:
        found = [f for f in found if f[1] == rank]
    if node is not None:
        found = [f for f in found if f[0] == node]
    if not found:
        raise InjectionError(f"no running worker matches node={node} rank={rank} in "
                             f"{run_dir}/agents (is the run past its start?)")
    return max(found, key=lambda f: f[1])


def _job_of(pid: int) -> str | None:
    return procfs.environ_value(pid, "SLURM_ROBUST_JOB_ID") or \
        procfs.environ_value(pid, "SLURM_JOB_ID")


def _belongs(pid: int, job_id: str) -> bool:
    return _job_of(pid) == job_id and procfs.exists(pid)


def check_pid(pid: int, job_id: str) -> None:
    have = _job_of(pid)
    if have != job_id:
        raise InjectionError(f"pid {pid} does not belong to job {job_id} (its job: {have}); "
                             "the agent file is stale, retry in a moment")


def inject(fault: str, job_id: str, node: str | None = None, rank: int | None = None,
           run_dir: str | None = None, duration_s: float = 10.0,
           period_s: float = 0.2, mode: str = "param", probability: float = 0.1,
           bitwise: bool = False, slowdown: float = 2.0) -> dict[str, Any]:
    """Inject ``fault`` into job ``job_id``; returns what was done (also recorded)."""
    if fault not in FAULTS:
        raise InjectionError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    # The job's own user must own the directory its comment (or --run-dir) names: the
    # comment is the job's words, and this runs as root (status.job_run).
    run = job_run(job_id, run_dir)
    run_dir, owner = run.run_dir, run.owner
    now = time.time()
    if fault == "sdc" or (fault == "nan" and mode == "data"):  # NaN ladder
        from slurm_robust_rehearsal.inject import nan_faults

        def mine(pid: int) -> bool:
            return _belongs(pid, job_id)

        if fault == "sdc":
            if node is None:
                raise InjectionError("sdc needs --node")
            extra = nan_faults.inject_sdc(job_id, run_dir, node, probability, bitwise, mine,
                                           owner)
        else:
            wnode, wrank, _ = pick_worker(run_dir, node, rank, job_id, owner)
            extra = nan_faults.inject_data_nan(job_id, run_dir, wrank, wnode, mine, owner)
        record = {"fault": fault, "job_id": job_id, "time": now, **extra}
    elif fault == "kill-node":
        if node is None:
            node, _, _ = pick_worker(run_dir, None, rank, job_id, owner)
        record = {"fault": fault, "job_id": job_id, "node": node, "time": now,
                  **kill_node(job_id, node)}
    else:
        wnode, wrank, pid = pick_worker(run_dir, node, rank, job_id, owner)
        check_pid(pid, job_id)
        # Stamped at the signal, not before the lookup above (tens of ms of /proc reads
        # on a busy node): the benchmarks time the recovery from it.
        record = {"fault": fault, "job_id": job_id, "node": wnode, "rank": wrank,
                  "pid": pid, "time": time.time()}
        if fault == "kill-worker":
            os.kill(pid, signal.SIGKILL)
        elif fault == "stop-worker":
            os.kill(pid, signal.SIGSTOP)
        elif fault == "nan":
            if not procfs.catches_signal(pid, signal.SIGUSR1):
                raise InjectionError(f"worker {pid} does not handle SIGUSR1: it does not use "
                                     "slurm_robust.train, so it cannot take a NaN injection")
            os.kill(pid, signal.SIGUSR1)
        else:
            if not 0.002 <= period_s <= duration_s:
                raise InjectionError(f"slow-worker: period {period_s} s must be in "
                                     f"0.002..duration ({duration_s} s)")
            if not 1.0 < slowdown <= 20.0:
                raise InjectionError(f"slow-worker: slowdown {slowdown} must be in (1, 20] "
                                     "(times slower than normal)")
            record.update(duration_s=duration_s, period_s=period_s, slowdown=slowdown)
            slow_down(pid, duration_s, period_s, stopped_fraction=1.0 - 1.0 / slowdown)
    # Written by the job's user, not by root into the user's directory (run_dir_trust).
    name = f"{time.strftime('%H%M%S')}-{int(now * 1000) % 1000:03d}-{fault}.json"
    write_json_as_owner(RunPaths.of(run_dir).inject, name, record, owner)
    return record


def slow_down(pid: int, duration_s: float, period_s: float = 0.2,
              stopped_fraction: float = 0.5) -> None:
    """Stop and continue ``pid`` in a duty cycle: stopped ``stopped_fraction`` of each
    ``period_s`` (0.5: it runs about half as fast).

    The cycle runs at a real-time priority where this process may take one (root): a
    slow GPU's slowness does not depend on who else wants the host's cores, and the
    stand-in's should not either. At normal priority, on 2 cores shared with another
    cluster's jobs, the wake-up to stop the worker came late: its run windows stretched
    from 4 ms to tens, its compute fit in one, and a 5x slowdown measured 1x.
    """
    end = time.time() + duration_s
    realtime = _realtime_priority()
    try:
        while time.time() < end:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(period_s * stopped_fraction)
            os.kill(pid, signal.SIGCONT)
            time.sleep(period_s * (1 - stopped_fraction))
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        if realtime is not None:
            os.sched_setscheduler(0, *realtime)


def _realtime_priority() -> tuple[int, os.sched_param] | None:
    """Switch this process to SCHED_FIFO (a low real-time priority) and return the policy
    to restore, or None where it is not permitted (then the cycle runs as before)."""
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except OSError:  # PermissionError without root
        return None
    return before


def kill_node(job_id: str, node: str, cluster_dir: str | None = None) -> dict[str, Any]:
    """Lose ``node`` for the job, as faithfully as one host allows (mini-cluster only).

    ``cluster_dir``: the mini-cluster's root; default ``$SLURM_ROBUST_CLUSTER_DIR`` (set
    for the CLI by ``cluster env``; a bench that calls this in-process passes it)."""
    cluster = cluster_dir or os.environ.get(CLUSTER_DIR_ENV)
    pidfile = Path(cluster or "/nonexistent") / "run" / f"mc-slurmd-{node}.pid"
    if not cluster or not pidfile.exists():
        raise InjectionError(f"kill-node works on the mini-cluster only (needs "
                             f"${CLUSTER_DIR_ENV} and {pidfile}); on a real cluster power the "
                             "node off or stop its slurmd by hand")
    slurmd = int(pidfile.read_text().strip())
    if "slurmd" not in procfs.cmdline(slurmd):
        raise InjectionError(f"pid {slurmd} from {pidfile} is not a slurmd")
    # A real node vanishes at once; here its processes die one by one, so the order
    # matters. srun (on the batch node) goes first: alive, it answers its step's
    # distress by killing the step's tasks on every node -- when the batch slurmstepd
    # sees the batch script die it sends srun SIGCONT+SIGTERM, and srun forwards
    # SIGKILL. No SIGSTOP either: stopped members of a process group orphaned by the
    # kill get SIGHUP+SIGCONT from the kernel, with the same effect.
    # Before srun, the batch step's slurmstepd: alive, it sees the batch script exit once
    # srun is gone and reports the batch step complete, and slurmctld then ends the whole
    # job, killing every other node's tasks (a dead node reports nothing).
    victims = job_processes(job_id, node)
    batch = [p for p in victims if procfs.cmdline(p).startswith("slurmstepd")
             and ".batch]" in procfs.cmdline(p)]
    sruns = [p for p in victims if procfs.cmdline(p).startswith("srun")]
    # srun forks a "shepherd" child that waits on a pipe from its parent and, when the
    # parent dies (EOF), kills the step with SIGKILL on every node (Slurm's srun_job.c,
    # _shepherd_spawn). On a real node both vanish together; here the shepherd goes
    # first, or it cancels the step everywhere when it outlives its parent by a moment.
    shepherds = [p for p in sruns if procfs.read_ppid(p) in sruns]
    _signal_all(batch, signal.SIGKILL)
    _signal_all(shepherds, signal.SIGKILL)
    _signal_all([p for p in sruns if p not in shepherds], signal.SIGKILL)
    os.kill(slurmd, signal.SIGKILL)
    _signal_all([p for p in victims if p not in sruns and p not in batch], signal.SIGKILL)
    wiped = wipe_node_dirs(job_id, node)
    return {"slurmd_pid": slurmd, "killed": victims, "wiped": wiped}


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def job_processes(job_id: str, node: str) -> list[int]:
    """Every process of the job on the node, and the slurmstepds they run under."""
    tasks = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        if (procfs.environ_value(pid, "SLURM_JOB_ID") == job_id
                and procfs.environ_value(pid, "SLURMD_NODENAME") == node):
            tasks.append(pid)
    steps = {pp for pp in (procfs.read_ppid(p) for p in tasks)
             if pp and procfs.cmdline(pp).startswith("slurmstepd")}
    return sorted(steps) + sorted(tasks)


def wipe_node_dirs(job_id: str, node: str) -> list[str]:
    site = load_site()
    wiped = []
    for root in (site.node_path(site.shm_root, node), site.node_path(site.local_root, node)):
        # The job's directories carry a keyed suffix (<job>.<key>, see launcher/auth.py).
        for path in (root / job_id, *root.glob(f"{job_id}.*"), root / node / job_id,
                     *(root / node).glob(f"{job_id}.*")):
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                wiped.append(str(path))
    return wiped


def revive_node(node: str) -> None:
    """Mini-cluster: restart missing daemons (``cluster up`` is idempotent) and return
    ``node`` to service if it was marked down or drained by the loss."""

    mc = MiniCluster(ClusterConfig().with_saved_shape())  # same nodes and network mode
    mc.up()
    slurm = Slurm(mc.cfg.env())
    try:
        info = slurm.node(node)
        if info.state == "down" or info.drained:
            slurm.resume(node)
    except SlurmCommandError:
        pass
