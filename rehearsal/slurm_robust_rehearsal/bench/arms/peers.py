"""What the restart-from-disk peers share: one ``bench recovery`` run, the elastic
agents' batch script, and reading the example's progress file."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust_rehearsal.bench.arms.base import EXAMPLE, RecoveryRun, Seconds, Setup
from slurm_robust_rehearsal.bench.polling import wait_for

#: The torchrun arms' environment. With its default (one rendezvous TCPStore shared by
#: every round) the workers of a restarted round find the previous round's keys; the
#: example then keyed its group by TORCHELASTIC_RESTART_COUNT, which the agents do not
#: agree on (the one whose worker failed counts the restart, the others 0): the new group
#: never formed (2 of 3 bench recovery runs, and the ETTR peer after its 4th restart).
#: A store per round is torchrun's own option for this.
TORCHRUN_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"

#: The rendezvous host: the address Slurm reaches the allocation's first node at, as a
#: multi-node torchrun job script finds its master (127.0.0.1 on the shared-network
#: mini-cluster, the node's own address when each node has its network namespace).
RDZV_HOST = ('export RDZV_HOST=$(scontrol show node "$(scontrol show hostnames '
             '"$SLURM_JOB_NODELIST" | head -n 1)" | tr " " "\\n" | '
             "sed -n 's/^NodeAddr=//p')")
#: Each agent's own address (``--local-addr``): torchrun hands rank 0's to the workers as
#: MASTER_ADDR, and its default, the host name, is the host's address in every node's
#: network namespace, where the workers' group could not form.
LOCAL_ADDR = ('--local-addr="$(scontrol show node "$SLURMD_NODENAME" | tr " " "\\n" | '
              "sed -n 's/^NodeAddr=//p')\"")


class PeerBase:
    """Defaults of a restart-from-disk peer; ``name`` comes from the registry."""

    subject = False
    optional_key: str | None = None
    label = ""
    speedup_key = ""
    #: Added to the rendezvous port (base + pid % 1000): the peers' runs apart from each
    #: other and clear of the robust launcher's.
    port_offset = 0

    def __init__(self, name: str) -> None:
        self.name = name
        self.redone_key = name

    def missing(self, setup: Setup) -> str | None:
        return None

    def fault_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        return {self.label: secs}

    def speedup_figures(self, secs: Seconds, hold: int | None) -> dict[str, Seconds]:
        return {self.speedup_key: secs}

    def script(self, run: RecoveryRun, port: int, worker: list[str]) -> str:
        raise NotImplementedError

    def launch(self, run: RecoveryRun) -> dict[str, Any]:
        return peer_run(self, run)


def peer_run(arm: PeerBase, run: RecoveryRun) -> dict[str, Any]:
    """One run of a restart-from-disk peer, its batch script from ``arm.script``."""
    args, slurm = run.args, run.slurm
    kind = arm.name
    run_dir = run.cfg.shared_dir / f"bench-{kind}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True)
    progress = run_dir / "progress.txt"
    marker = str(run_dir / "ckpt")
    worker = [sys.executable, str(EXAMPLE), *run.train, "--save-every", str(args.save_every),
              "--ckpt-dir", marker, "--progress-file", str(progress)]
    port = 40000 + os.getpid() % 1000 + arm.port_offset
    script = arm.script(run, port, worker)
    t0 = time.time()
    job = slurm.sbatch(["-N", str(args.nodes), "--ntasks-per-node=1", "-p", "train",
                        "--requeue", "-J", f"bench-{kind}", "-o", str(run_dir / "slurm-%j.out")],
                       script=script)
    try:
        last = wait_for(lambda: max_step(progress) >= args.fault_step, args.timeout,
                        "plain run to reach the fault step")
        pid = find_worker(marker, rank=str(args.nodes - 1))
        last = max_step(progress)
        fault_t = time.time()
        os.kill(pid, signal.SIGKILL)
        # The step in flight at the kill can still be logged after it (its all-reduce
        # had finished): not a recovery. A kill between saves makes the restarted run
        # redo steps, so its first step is one at or below the last one before the kill.
        redo = args.fault_step % args.save_every != 0
        nxt = wait_for(lambda: first_after(progress, fault_t, last if redo else None),
                       args.timeout, "plain run to finish a step after the fault")
        wait_for(lambda: (j := slurm.job(job)) is not None and j.finished, args.timeout,
                 "plain run to end")
    finally:
        j = slurm.job(job)
        if j is not None and not j.finished:
            slurm.cancel(job)
    sha = printed_sha(run_dir, job)
    step, t_next = nxt
    return {"job_id": job, "fault_to_next_step_s": round(t_next - fault_t, 2),
            "last_step_before_fault": last, "resumed_at_step": step - 1,
            "steps_redone": last - (step - 1), "wall_s": round(time.time() - t0, 1),
            "params_sha256": sha, "run_dir": str(run_dir)}


def printed_sha(run_dir: Path, job: str) -> str | None:
    """The final parameters' digest the example printed (``params_sha256=...``) into the
    job's ``slurm-<job>.out``; None when it never got there."""
    out = (run_dir / f"slurm-{job}.out").read_text(errors="replace")
    return next((ln.split("=")[1].split()[0] for ln in out.splitlines()
                 if ln.startswith("params_sha256=")), None)


def elastic_worker(worker: list[str]) -> list[str]:
    """The elastic agents take the script, not the interpreter; their workers save with
    DCP."""
    return [*worker[1:], "--ckpt-format", "dcp_async"]


def elastic_args(nodes: int, max_restarts: int, port: int, rdzv_prefix: str) -> list[str]:
    return [f"--nnodes={nodes}", "--nproc-per-node=1", f"--max-restarts={max_restarts}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=$RDZV_HOST:{port}",
            f"--rdzv-id={rdzv_prefix}$SLURM_JOB_ID"]


def agent_script(agent: list[str], export: str | None, worker: list[str]) -> str:
    """``srun`` of one elastic agent per node, each through ``sh -c`` to find its own
    address; ``$``-words are left for the shells."""
    inner = " ".join(a if "$" in a else shlex.quote(a) for a in agent) + " " + LOCAL_ADDR \
        + " " + " ".join(shlex.quote(w) for w in worker)
    head = ["#!/bin/sh", *([export] if export else []), RDZV_HOST]
    return "\n".join([*head, f"srun --kill-on-bad-exit=0 sh -c {shlex.quote('exec ' + inner)}"]) \
        + "\n"


def torchrun_script(nodes: int, max_restarts: int, port: int, rdzv_prefix: str,
                    worker: list[str]) -> str:
    """The batch script of a torchrun arm: one elastic agent per node (it takes the
    script, not the interpreter) with c10d rendezvous on ``port``; a dead worker makes
    every agent restart its worker in a new round, and the example reloads the newest
    DCP checkpoint. ``worker``: the script and its arguments. The agents watch their
    workers at torchrun's default interval (0.1 s), as its users run it."""
    agent = [sys.executable, "-m", "torch.distributed.run",
             *elastic_args(nodes, max_restarts, port, rdzv_prefix)]
    return agent_script(agent, f"export {TORCHRUN_ENV}", worker)


def steps(progress: Path) -> list[tuple[int, float]]:
    """The example's progress lines ``(step, time)``."""
    try:
        lines = progress.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def max_step(progress: Path) -> int:
    return max((s for s, _ in steps(progress)), default=0)


def first_after(progress: Path, t: float,
                at_most: int | None = None) -> tuple[int, float] | None:
    later = [(s, ts) for s, ts in steps(progress)
             if ts > t and (at_most is None or s <= at_most)]
    return min(later, key=lambda x: x[1]) if later else None


def find_worker(marker: str, rank: str) -> int:
    """The pid of the plain run's worker of ``rank`` (found by its unique checkpoint dir)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in cmd and str(EXAMPLE).encode() in cmd \
                and f"RANK={rank}".encode() in env:
            return int(entry)
    raise SlurmRobustError(f"no worker of rank {rank} found for {marker}")
