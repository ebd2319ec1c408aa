"""The per-node agent: one per node of the allocation (one Slurm task per node).

Agent 1 (SLURM_PROCID 1; agent 0 when the run has one agent) also runs the first
controller in a thread (control/failover.py says where, and why not on the batch node). Every agent:

1. publishes ``<run_dir>/agents/<node>.json`` (``{"node", "agent_pid", "workers": {rank:
   pid}, ...}``; the stack capture and ``inject`` read this exact format);
2. finds the controller of its job step through ``<run_dir>/controller.json`` (its
   ``key`` is job id, step id and Slurm restart count, so a stale file of an earlier
   allocation is never used) and reports to it every ``heartbeat_s`` (longer past 200
   agents, control/cadence.py), and at once when one of its workers exits or the
   controller wakes it (workers.wait_for_exit); it waits for a late answer up to the
   heartbeat timeout (a late controller is waited for, control/overload.py);
3. reconciles its workers with the plan it gets back: a new generation means stop the
   old workers and start the new ones (or park, for a spare); a stack request means
   dump its workers' stacks (in a thread, so reports continue); ``exit`` ends it;
4. owns the node's shared-memory snapshots across worker restarts and removes them
   when the run completes;
5. if the controller is gone for ``heartbeat_timeout_s``, follows a newer controller,
   becomes the successor (control/succession.py: lowest index first, one term claim), or,
   with no spare parked, records the incident and requeues the job (one agent does it,
   under an O_EXCL lock file). It ignores plans of a controller term older than one it
   has seen (an old controller that came back).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slurm_robust.ckpt import CheckpointConfig, purge_job_memory
from slurm_robust.launcher.auth import (
    HANDSHAKE_S,
    ckpt_job_key,
    client_handshake,
    ensure_run_secret,
)
from slurm_robust.launcher.classify import classify
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import cadence, failover
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.control.failover import ControllerRecord
from slurm_robust.launcher.control.outcome import OutcomeSummary
from slurm_robust.launcher.control.requeue import requeue_after_controller_loss
from slurm_robust.launcher.control.succession import Outcome, after_controller_loss
from slurm_robust.launcher.diagnose import diagnose
from slurm_robust.launcher.enums import Category, Role, RunStatus
from slurm_robust.launcher.errors import RunStopped
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.limits import raise_nofile_limit
from slurm_robust.launcher.messages import (
    BadMessage,
    DiagnosisReport,
    Finding,
    Plan,
    Progress,
    Reply,
    Report,
    WorkerExit,
)
from slurm_robust.launcher.node import evidence as node_evidence
from slurm_robust.launcher.node import workers as wk
from slurm_robust.launcher.node.fence import standing_down
from slurm_robust.launcher.node.forkserver_client import ForkServer
from slurm_robust.launcher.node.monitor import start_monitor
from slurm_robust.launcher.paths import (
    RunPaths,
    load_site,
    node_local_root,
    node_shm_root,
    progress_dir,
)
from slurm_robust.launcher.protocol import (
    MAX_UNAUTHENTICATED,
    Channel,
    ChannelClosed,
    host_address,
)
from slurm_robust.launcher.wire_records import StackSummary
from slurm_robust.launcher.worker_signals import WARNING_SIGNAL
from slurm_robust.records import write_json_atomic
from slurm_robust.run_dir_trust import (
    check_run_dir,
    ensure_private_subdir,
    ensure_run_dir,
    read_trusted_json,
)
from slurm_robust.scriptenv import worker_command
from slurm_robust.secure_fs import UnsafePathError, private_dir, relative_parts
from slurm_robust.stacks.capture import CaptureOptions, capture_local
from slurm_robust.taxonomy import Action, Side

log = logging.getLogger("slurm_robust.launcher.node.agent")
#: Longest wait for the controller of this job step to appear.
CONNECT_TIMEOUT_S = 180.0
#: How long an agent waits for a late answer from a controller that still passes a
#: handshake, in heartbeat timeouts since its last answer (Agent._exchange): past it, a
#: controller that authenticates but never answers is given up on and reconnected to.
LATE_WAIT_TIMEOUTS = 4


class Agent:
    """One node's agent (see the module docstring)."""

    def __init__(self, cfg: RunConfig, ident: Identity) -> None:
        # The heartbeat and its timeout for this many agents (the controller's too).
        self.cfg = cfg = cadence.scaled(cfg)
        self.ident = ident
        self.paths = RunPaths.of(cfg.run_dir)
        self.site = load_site(cfg.site_config)
        self.gen = -1
        self.role = Role.NEW
        self.workers: list[wk.Worker] = []
        self.exits: list[WorkerExit] = []
        self.pending: list[Progress] = []
        self.stacks_done: dict[str, StackSummary] = {}
        self._stack_threads: dict[str, threading.Thread] = {}
        self.diagnoses_done: dict[str, DiagnosisReport] = {}
        self._diagnosis_threads: dict[str, threading.Thread] = {}
        self.plan: Plan | None = None
        #: The plan the controller last sent in full on this connection, with its
        #: identity (messages.Reply): what an "unchanged" reply stands for.
        self.held: tuple[str, Plan] | None = None
        # What the run directory holds steers what this agent runs (run_dir_trust.py).
        ensure_run_dir(cfg.run_dir)
        if cfg.durable_every:
            # The durable tier's root is this run's alone: 0700, made before any worker
            # writes there (a root the checkpoint code made would be a sticky 1777 one).
            ensure_private_subdir(self.paths.durable)
        # The per-run secret (0600 in the run dir): authenticates the control channel
        # and names the checkpoint directories so no other user can pre-empt them.
        self.secret = ensure_run_secret(cfg.run_dir)
        self.ckpt_key = ckpt_job_key(ident.job_id, self.secret)
        self.forks = ForkServer(cfg.command, cfg.prewarm, {**os.environ, **cfg.env})
        #: The worker pids the agent file shows (publish): rewritten when one starts.
        self.published: dict[str, int] = {}
        # the in-job node monitor, its own thread; findings ride on
        # the reports until one is answered.
        self.monitor = start_monitor(ident.node, ident.job_id, self.site)
        self.findings: list[Finding] = []
        #: Set on the agent that runs the controller: whether that thread still runs. A live
        #: local controller that is slow to answer is waited for, never blamed.
        self.local_controller: Callable[[], bool] | None = None
        #: Controllers this process ran (the first one, or one it took over with).
        self.controllers: list[Controller] = []
        #: The newest controller term seen (controller.json, plans); older plans are void.
        self.term = 0
        #: When Slurm's time-limit warning arrived (listen_for_slurm_signals); reported.
        self.warned: float | None = None
        #: When SIGTERM arrived (listen_for_slurm_signals): Slurm is ending the allocation.
        self.ending: float | None = None

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self.monitor is not None:  # in-job monitor
                self.monitor.stop()
            self.forks.close()

    def _run(self) -> int:
        self.publish()
        # Imports torch once while the controller gathers the agents; the first
        # generation's orders wait in its pipe, every later one is a fork (milliseconds).
        self.forks.start()
        # The controller starts with the allocation: a bounded wait, not the workers' one.
        chan = self._connect(CONNECT_TIMEOUT_S)
        last_ok = time.time()
        while True:
            try:
                if chan is None:
                    chan = self._connect(1.0)
                if chan is None:
                    raise ChannelClosed("controller unreachable")
                reply = Reply.from_json(self._exchange(chan, last_ok))
                plan = self._plan_of(reply)
                if plan is not None and plan.term is not None and plan.term < self.term:
                    # An old controller that came back: not obeyed; the
                    # report is sent again to the newer one.
                    raise ChannelClosed(f"plan of term {plan.term} < {self.term}")
                if plan is not None and plan.term is not None:
                    self.term = max(self.term, plan.term)
                if not reply.unchanged:
                    self.held = (reply.plan_id, plan) \
                        if plan is not None and reply.plan_id else None
                last_ok = time.time()
                self.pending.clear()
                self.findings.clear()  # in-job monitor findings: delivered with this report
            except BadMessage as exc:
                # The report went through; only the answer is refused. Reconnect (and
                # ask for the plan in full: _connect forgets the held one).
                log.warning("agent %s: controller's answer refused: %s", self.ident.index, exc)
                chan.close()
                chan = None
                time.sleep(self.cfg.heartbeat_s)
                continue
            except (OSError, ChannelClosed) as exc:
                if chan is not None:
                    chan.close()
                chan = None
                if time.time() - last_ok > self.cfg.heartbeat_timeout_s:
                    if self.local_controller is not None and self.local_controller():
                        log.warning("agent %s: local controller slow to answer (%s); "
                                    "waiting", self.ident.index, exc)
                        last_ok = time.time()
                    else:
                        code = self.controller_lost(str(exc), last_ok)
                        if code is not None:
                            return code
                        last_ok = time.time()  # a new controller: its own grace
                time.sleep(self.cfg.heartbeat_s)
                continue
            done = self.apply(plan)
            if done is None:
                done = self._until_next_report(chan, plan)
            if done is not None:
                chan.close()
                return done

    def _until_next_report(self, chan: Channel, plan: Plan | None) -> int | None:
        """Wait until the next report is due: the heartbeat (the plan's ``poll_s``), cut
        short by a worker's exit or the fork server's news. A plan the controller pushes
        meanwhile (protocol.py) is applied at once and the wait goes on (the new plan's
        ``poll_s`` may shorten it). The agent's exit code if a pushed plan ends it."""
        self.poll_workers()
        deadline = time.monotonic() + self._poll_s(plan)
        while True:
            try:
                woken, messages = chan.read_ready()
                pushed = [Reply.from_json(m) for m in messages]
            except (OSError, ChannelClosed, BadMessage):
                return None  # the report's exchange meets it and reconnects
            if woken:
                return None  # an older controller's wake-up: report now
            fresh = [r for r in pushed if r.push and r.plan is not None and r.plan_id
                     and (r.plan.term is None or r.plan.term >= self.term)]
            if len(fresh) != len(pushed):
                return None  # not a push this controller may send: report, and see
            if fresh:
                newest = fresh[-1]
                plan = newest.plan
                assert plan is not None and newest.plan_id is not None
                if plan.term is not None:
                    self.term = max(self.term, plan.term)
                self.held = (newest.plan_id, plan)
                done = self.apply(plan)
                if done is not None:
                    return done
                self.poll_workers()
                deadline = min(deadline, time.monotonic() + self._poll_s(plan))
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            wk.wait_for_exit([w for w in self.workers if not w.reported], left,
                             wake_fd=chan.fileno(), server=self.forks)
            if not chan.has_input():
                return None  # a worker's exit, the server's news, or the heartbeat

    def _exchange(self, chan: Channel, last_ok: float) -> dict[str, object]:
        """Send a report and wait for its answer: past the socket timeout, until a
        heartbeat timeout since the last answer, and on while the controller passes a
        handshake on a second connection (at most LATE_WAIT_TIMEOUTS timeouts in all).

        A controller that is late answers late: its report loop held up, its machine
        starved. Giving up on the connection would add a reconnect to its load, and
        worse, the controller takes a closed connection for a dead process (the kernel
        closes a dead agent's sockets), so a late controller whose own tick kept time
        would declare a live node lost. A dead controller's kernel closes the connection
        at once; a dead or cut-off controller node passes no handshake, and then the
        silence ends at the timeout as before."""
        chan.send(self.report().to_json())
        timeout = self.cfg.heartbeat_timeout_s
        while True:
            try:
                raw = chan.recv()
                if raw.get("push") is True:
                    continue  # the answer that follows is as new (protocol.py)
                return raw
            except TimeoutError:
                waited = time.time() - last_ok
                if waited <= timeout:
                    continue
                if waited <= LATE_WAIT_TIMEOUTS * timeout and self._answers():
                    log.info("agent %s: no answer for %.1f s, but the controller passes a "
                             "handshake: waiting on", self.ident.index, waited)
                    continue
                raise

    def _plan_of(self, reply: Reply) -> Plan | None:
        """The plan a reply stands for: its own, or for "unchanged" the plan this agent
        holds under the identity the reply names (BadMessage if it holds another)."""
        if not reply.unchanged:
            return reply.plan
        if self.held is None or self.held[0] != reply.plan_id:
            raise BadMessage(f"reply: 'unchanged' names plan {reply.plan_id!r}; this agent "
                             f"holds {self.held[0] if self.held else None!r}")
        return self.held[1]

    def _poll_s(self, plan: Plan | None) -> float:
        """Seconds to the next report: the heartbeat, or the plan's shorter poll_s while
        the controller says a transition is imminent (never under 10 ms)."""
        if plan is None or plan.poll_s is None:
            return self.cfg.heartbeat_s
        return min(self.cfg.heartbeat_s, max(0.01, plan.poll_s))

    def _connect(self, timeout_s: float, probe: bool = False) -> Channel | None:
        """An authenticated connection to the controller (None: none within
        ``timeout_s``). ``probe``: only to learn whether it answers, so the plan this
        agent holds stays its own (a report in flight may be answered "unchanged")."""
        deadline = time.time() + timeout_s
        while True:
            info = self._controller_info()
            if info is not None:
                wait_s = max(2.0, self.cfg.heartbeat_timeout_s / 2)
                try:
                    chan = Channel.connect(info["host"], int(info["port"]), wait_s)
                except OSError:
                    chan = None
                if chan is not None:
                    try:  # both ends prove they hold the run secret (auth.py)
                        # A fake controller on a dead one's port gets one deadline and a
                        # small message bound; whatever it sends, AuthError (an OSError)
                        # or ChannelClosed: a failed connect, retried.
                        with chan.bounded(min(HANDSHAKE_S, wait_s), MAX_UNAUTHENTICATED):
                            client_handshake(chan, self.secret)
                        # A new connection starts from the plan in full: the identity
                        # would keep an "unchanged" from another controller out anyway
                        # (replies.py), and one full plan per reconnect costs little.
                        if not probe:
                            self.held = None
                        return chan
                    except (OSError, ChannelClosed) as exc:
                        log.warning("controller at %s:%s failed the handshake: %s",
                                    info["host"], info["port"], exc)
                        chan.close()
            if time.time() >= deadline:
                return None
            time.sleep(0.1)

    def _answers(self) -> bool:
        """Whether the controller passes a handshake now (it refuses one while its loop
        holds the lock, so a pass means it ticks again)."""
        chan = self._connect(1.0, probe=True)
        if chan is None:
            return False
        chan.close()
        return True

    def _controller_info(self) -> ControllerRecord | None:
        try:
            info = read_trusted_json(self.paths.controller)
        except (OSError, ValueError):
            return None
        except UnsafePathError as exc:  # planted: never connected to, never trusted
            log.warning("agent %s: %s", self.ident.index, exc)
            return None
        if not isinstance(info, dict) or info.get("key") != self.ident.step_key:
            return None
        self.term = max(self.term, int(info.get("term") or 0))
        return info

    # ------------------------------------------------------------------ reporting
    def report(self) -> Report:
        self.poll_workers()
        states = {str(w.rank): wk.process_state(w.pid) for w in self.workers
                  if w.popen.poll() is None and w.pid is not None}
        sample = None
        if self.monitor is not None:  # in-job monitor
            new, sample = self.monitor.take()
            self.findings.extend(new)
        return Report(op="report", agent=self.ident.index, node=self.ident.node,
                      pid=os.getpid(), addr=host_address(), key=self.ident.step_key,
                      gen=self.gen, role=self.role, exits=list(self.exits),
                      progress=list(self.pending), states=states,
                      stacks=dict(self.stacks_done), time=time.time(),
                      findings=list(self.findings), sample=sample,
                      diagnoses=list(self.diagnoses_done.values()),
                      term=self.term, warned=self.warned, ending=self.ending,
                      plan_id=self.held[0] if self.held else None)

    def listen_for_slurm_signals(self) -> None:
        """Note Slurm's warning before the time limit (WARNING_SIGNAL); the next report
        carries it to the controller, which requeues the job with its newest step. (With
        submitit's USR2, its handler requeued from task 0 and ended that agent, and the
        workers died of the signal: the controller took them all for lost nodes.)"""
        def on_warning(signum: int, frame: object) -> None:
            if self.warned is None:
                self.warned = time.time()

        # SIGTERM is Slurm ending the allocation (a requeue by an admin or by the
        # controller, a preemption, a cancel, the limit's kill): the workers got it too
        # and die of it, and the controller must take none of that for a failure. The
        # agent stays (as under submitit's handler, which ignored it) to say so; Slurm's
        # SIGKILL after KillWait or GraceTime ends it.
        def on_terminate(signum: int, frame: object) -> None:
            if self.ending is None:
                self.ending = time.time()

        try:
            signal.signal(WARNING_SIGNAL, on_warning)
            signal.signal(signal.SIGTERM, on_terminate)
        except ValueError:  # not the main thread (an embedding caller): nobody to warn
            log.warning("agent %s: not the main thread; the time-limit warning is not "
                        "handled", self.ident.index)

    def poll_workers(self) -> None:
        if self.running_pids() != self.published:
            self.publish()  # a pending fork started (or a worker ended): show its pid
        for w in self.workers:
            self.pending.extend(self._progress(w))
            if w.reported or w.popen.poll() is None:
                continue
            w.reported = True
            w.exit_time = time.time()
            code, sig = wk.exit_status(w.popen.returncode)
            self.pending.extend(self._progress(w))
            if code == 0:
                self.exits.append(WorkerExit(rank=w.rank, gen=w.gen, exit_code=0, signal=None,
                                             time=w.exit_time))
                continue
            self.exits.append(self._classified_exit(w, code, sig))

    # --- call site: classification from all the evidence --------------------
    def _classified_exit(self, w: wk.Worker, code: int | None, sig: int | None) -> WorkerExit:
        """Classify a failed worker from its exit status, log tail, the trusted task-exit
        record, the kernel log and NVML (node/evidence.py), and carry side and action."""
        assert w.exit_time is not None
        # The kernel's clock is CLOCK_MONOTONIC: the worker's start on that clock, with a
        # little slack for a message logged just before the spawn returned.
        since = time.monotonic() - (w.exit_time - w.started) - 2.0
        got = node_evidence.gather(site=self.site, node=self.ident.node,
                                   job_id=self.ident.job_id, pid=w.pid or 0, exit_code=code,
                                   sig=sig, log_tail=wk.log_tail(w.log_path),
                                   since_monotonic=since)
        ev = got.evidence
        if self.plan is not None and self.plan.code_change:  # hot update: a recorded change
            ev = dataclasses.replace(ev, change_recorded=True)
        c = classify(ev)
        evidence = c.evidence.copy()
        evidence["decided_by"] = c.source
        if got.skipped:
            evidence["not_consulted"] = got.skipped
        return WorkerExit(
            rank=w.rank, gen=w.gen, exit_code=code, signal=sig, time=w.exit_time,
            cls=c.cls, category=Category(c.category), secondary=c.secondary,
            signature=c.signature, line=c.line, evidence=evidence, log=str(w.log_path),
            side=Side(c.side), action=Action(c.action))

    def _progress(self, w: wk.Worker) -> list[Progress]:
        """The worker's new progress lines, checked here (the worker side is user code):
        a malformed line is logged and dropped, never sent on."""
        out = []
        for item in wk.read_progress(w):
            try:
                out.append(Progress.from_json(item))
            except BadMessage as exc:
                log.warning("rank %s: progress line dropped: %s", w.rank, exc)
        return out

    def running_pids(self) -> dict[str, int]:
        """rank -> pid of the workers that run (started, not exited)."""
        return {str(w.rank): w.pid for w in self.workers
                if w.pid is not None and w.popen.poll() is None}

    def publish(self) -> None:
        self.published = self.running_pids()
        write_json_atomic(self.paths.agent_file(self.ident.node), {
            "node": self.ident.node, "agent_pid": os.getpid(), "agent": self.ident.index,
            "job_id": self.ident.job_id, "gen": self.gen, "role": self.role,
            "workers": self.published, "time": time.time()}, mode=0o600)

    # ------------------------------------------------------------------ plan
    def apply(self, plan: Plan | None) -> int | None:
        """Reconcile with the plan; returns an exit code when the agent should end."""
        if plan is None:
            return None
        self.plan = plan
        if plan.role is Role.EXIT:
            wk.stop_workers(self.workers, self.cfg.grace_s)
            if plan.purge:
                self.purge()
            return int(plan.exit_code or 0)
        if plan.gen != self.gen or plan.role != self.role:
            self.restart(plan)
        capture = plan.stacks
        if capture and capture not in self.stacks_done and capture not in self._stack_threads:
            t = threading.Thread(target=self._capture, args=(capture,), daemon=True)
            self._stack_threads[capture] = t
            t.start()
        # --- call site: stop-time diagnosis asked for by the plan -------------
        wanted = plan.diagnose
        if wanted and wanted not in self.diagnoses_done and \
                wanted not in self._diagnosis_threads:
            # The failed generation's workers go first: the self-test needs the GPUs.
            wk.stop_workers(self.workers, self.cfg.grace_s)
            t = threading.Thread(target=self._diagnose, args=(wanted,), daemon=True)
            self._diagnosis_threads[wanted] = t
            t.start()
        return None

    def _diagnose(self, diagnosis_id: str) -> None:
        """Run launcher/diagnose.py on this node; its outcome goes in the next report."""
        try:
            # journal=False: the health journal is root's record; a diagnosis the job ran
            # goes into the incident (and the verdict) instead.
            d = diagnose(self.ident.node, config=self.site, job=self.ident.job_id,
                         journal=False)
            report = DiagnosisReport(id=diagnosis_id, node=self.ident.node, passed=d.passed,
                                     complete=d.complete, elapsed_s=d.elapsed_s,
                                     reason=d.reason, evidence=d.evidence())
        except Exception as exc:  # noqa: BLE001 - a diagnosis that cannot run blames nobody
            log.warning("diagnosis %s could not run on %s: %s", diagnosis_id,
                        self.ident.node, exc)
            report = DiagnosisReport(id=diagnosis_id, node=self.ident.node, passed=True,
                                     complete=False, elapsed_s=0.0,
                                     evidence={"error": f"{type(exc).__name__}: {exc}"})
        self.diagnoses_done[diagnosis_id] = report

    def restart(self, plan: Plan) -> None:
        wk.stop_workers(self.workers, self.cfg.grace_s, drain_s=plan.drain_s or 0.0)
        self.workers, self.exits = [], []
        self.gen, self.role = int(plan.gen if plan.gen is not None else -1), plan.role
        if self.role is Role.ACTIVE:
            ckpt = self._ckpt_config()
            attempt = plan.attempt or 0
            # a hot-updated version brings its own command and environment.
            base = plan.command or self.cfg.command
            extra_env = plan.env if plan.env is not None else self.cfg.env
            command = worker_command(base, attempt, self.cfg.resume_args,
                                     self.cfg.resume_if_exists, self.cfg.auto_steps)
            # Under the keyed, private job directory (not the guessable job id), so
            # that no other user can pre-create it or plant links in it.
            pdir = progress_dir(self.site, self.ckpt_key, self.ident.node)
            shm = node_shm_root(self.site, self.ident.node)
            with private_dir(shm, relative_parts(pdir, shm)):
                pass
            for local_rank, rank in enumerate(plan.ranks or []):
                progress = pdir / f"rank{rank}.gen{self.gen}.jsonl"
                env = wk.worker_env(os.environ, plan, rank, local_rank,
                                    self.ident.node,
                                    self.ident.job_id, self.cfg.run_dir, progress, ckpt,
                                    extra_env)
                log_path = self.paths.worker_log(self.gen, rank, attempt)
                # The fork server runs the config's interpreter: only for a command
                # that uses it.
                same = command[0] == worker_command(self.cfg.command, attempt)[0]
                self.workers.append(wk.spawn(command, env, rank, local_rank, self.gen,
                                             log_path, progress,
                                             self.forks if same else None))
        self.publish()
        log.info("agent %s on %s: generation %s, role %s, ranks %s", self.ident.index,
                 self.ident.node, self.gen, self.role, plan.ranks)

    def _ckpt_config(self) -> CheckpointConfig:
        return CheckpointConfig(
            shm_root=str(node_shm_root(self.site, self.ident.node)),
            local_root=str(node_local_root(self.site, self.ident.node))
            if self.cfg.local_every else None,
            durable_root=str(self.paths.durable) if self.cfg.durable_every else None,
            local_every=self.cfg.local_every, durable_every=self.cfg.durable_every,
            peer_backup=self.cfg.peer_backup and self.cfg.nodes > 1,
            peer_slots=self.cfg.peer_slots, job_key=self.ckpt_key)

    def _capture(self, capture_id: str) -> None:
        pids = {int(rank): pid for rank, pid in self.running_pids().items()}
        summary: StackSummary = {"ranks": sorted(pids), "error": None}
        if pids:
            try:
                template = str(self.paths.stacks / "faulthandler" / "{node}-{pid}.txt")
                res = capture_local(pids, self.ident.node, self.paths.stacks / capture_id,
                                    CaptureOptions(method=self.cfg.stack_method,
                                                   faulthandler_template=template,
                                                   budget_s=10.0),
                                    capture_id=capture_id)
                summary.update(res.summary())
            except Exception as exc:  # noqa: BLE001 - a failed dump must not stop recovery
                log.warning("stack capture %s failed on %s: %s", capture_id,
                            self.ident.node, exc)
                summary["error"] = f"{type(exc).__name__}: {exc}"
        self.stacks_done[capture_id] = summary

    # ------------------------------------------------------------------ endings
    def purge(self) -> None:
        """Remove this job's shared-memory snapshots on this node (the run is over)."""
        try:
            cfg = CheckpointConfig(shm_root=str(node_shm_root(self.site, self.ident.node)))
            purge_job_memory(cfg, self.ckpt_key, self.ident.node)
        except Exception as exc:  # noqa: BLE001 - leftover tmpfs files are reported, not fatal
            log.warning("could not purge shared memory on %s: %s", self.ident.node, exc)

    def controller_lost(self, why: str, last_ok: float) -> int | None:
        """The controller is silent: stand down when this node is the one cut off, follow
        a controller that answers again or a newer one, or take over (None: go on), or
        requeue / end (the agent's exit code). See control/succession.py and fence.py."""
        if standing_down(self.ident):  # cut off: neither controller nor slurmctld answers
            wk.stop_workers(self.workers, self.cfg.grace_s)
            return 0
        # A link that came back while slurmctld was asked: the controller, not this
        # agent, decides (it tells an agent it declared lost to stand down).
        if self._answers():
            return None
        got = after_controller_loss(self.cfg, self.ident, self.term, last_heard=last_ok,
                                    answers=self._answers)
        log.warning("agent %s: controller lost (%s): %s", self.ident.index, why,
                    got.outcome)
        if got.outcome is Outcome.FOLLOW:
            return None
        if got.outcome is Outcome.TAKE_OVER and got.takeover is not None:
            controller = Controller(self.cfg, self.ident, takeover=got.takeover)
            controller.start()
            self.controllers.append(controller)
            self.local_controller = controller.alive
            self.term = got.takeover.term
            return None
        wk.stop_workers(self.workers, self.cfg.grace_s)
        if got.outcome is Outcome.FINISHED:
            return 0
        info = self._controller_info() or {}
        requeue_after_controller_loss(self.cfg, self.ident, info.get("node"), why, last_ok)
        return 0


class AgentSummary(OutcomeSummary, total=False):
    """What :func:`run_agent` returns: this agent, its exit code, and the run's outcome as
    its controller saw it (when it hosted the one that ended the run)."""

    agent: int
    node: str
    exit_code: int | None


def run_agent(cfg: RunConfig) -> AgentSummary:
    """The function every Slurm task of a robust job runs (submitit pickles it).

    The first controller's agent (failover.first_controller_index: agent 1, off the batch
    node, when there are two agents or more) starts it first. Returns a summary dict;
    raises RunStopped on the agent whose controller ended the run with a verdict (the Slurm
    job then ends FAILED).
    """
    logging.basicConfig(level=os.environ.get("SLURM_ROBUST_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # Before any socket or pipe: the controller's connections and the workers' pipes
    # and pidfds must not hit the common soft limit of 1024 (limits.py).
    raise_nofile_limit()
    ident = Identity.from_env()
    controller = None
    ntasks = int(os.environ.get("SLURM_NTASKS") or cfg.total_nodes)
    if ident.index == failover.first_controller_index(ntasks):
        controller = Controller(cfg, ident)
        controller.start()
    agent = Agent(cfg, ident)
    agent.listen_for_slurm_signals()
    if controller is not None:
        agent.controllers.append(controller)
        agent.local_controller = controller.alive
    code = agent.run()
    summary: AgentSummary = {"agent": ident.index, "node": ident.node, "exit_code": code}
    for ctl in agent.controllers:
        result = ctl.join()
        if result is None or result.status is RunStatus.STOOD_DOWN:
            continue  # replaced by a successor: the run's end is not its own
        summary.update(result.summary())
        if result.status is RunStatus.STOPPED:
            raise RunStopped(result.verdict or "run stopped", cfg.run_dir)
    return summary


def main(argv: list[str] | None = None) -> int:
    """``python -m slurm_robust.launcher.node.agent RUN_DIR/config.json`` (used by `launch`)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        # The config names the workers' command: only one of ours, in a run directory
        # no one else can write (run_dir_trust.py).
        check_run_dir(Path(args[0]).parent)
        cfg = RunConfig.from_dict(read_trusted_json(args[0]))
        run_agent(cfg)
    except Exception as exc:  # noqa: BLE001 - exit status is what srun sees
        print(f"slurm-robust agent: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
