"""The controller: membership, heartbeats, progress, detection and the recovery ladder.

It runs as threads inside agent 0's process: a TCP server (one handler thread per
agent connection, see protocol.py) and a tick loop. Both work on one state object
under one lock. The tick loop gathers facts, asks the pure functions of policy.py what
to do, and applies the answer through :mod:`slurm_robust.launcher.recovery`.

The controller is the only writer of the run's event log and of ``state.json``.

Phases: ``gather`` (waiting for the agents of this allocation), ``running``,
``dumping`` (a hang: stacks being captured before anything is killed), ``requeued``
(waiting for Slurm to end this allocation), ``done``.
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import threading
import time
from typing import Any

from slurm_robust.launcher import failslow, recovery
from slurm_robust.launcher.agent import Identity
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.events import EventLog
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.policy import assign_slots, is_hung
from slurm_robust.launcher.protocol import Channel, ChannelClosed, host_address
from slurm_robust.launcher.state import load_state, save_state
from slurm_robust.records import write_json_atomic
from slurm_robust.stacks.failslow import FailSlowMonitor

log = logging.getLogger("slurm_robust.launcher.controller")

TICK_S = 0.05
#: A closed agent connection not re-opened within this long counts as a lost agent.
RECONNECT_GRACE_S = 0.5
#: Longest wait for every agent of the allocation before starting with those present.
GATHER_TIMEOUT_S = 60.0


class AgentView:
    """What the controller knows of one agent."""

    def __init__(self, index: int, node: str, pid: int, addr: str, now: float) -> None:
        self.index, self.node, self.pid, self.addr = index, node, pid, addr
        self.last_seen = now
        self.connected = True
        self.closed_at: float | None = None
        self.lost = False
        self.gen = -1
        self.exits_seen: set[tuple[int, int]] = set()
        self.stacks: dict[str, Any] = {}
        self.states: dict[str, str | None] = {}
        self.exit_sent = False


class Generation:
    """One start of the worker group: the plan's generation and what it has done."""

    def __init__(self, number: int, attempt: int, slots: list[int], started: float) -> None:
        self.number = number
        self.attempt = attempt
        self.slots = slots
        self.started_at = started
        self.last_progress = started
        self.steps_done = 0
        self.restored: dict[int, tuple[int | None, str | None]] = {}
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.finals: dict[int, dict[str, Any]] = {}
        self.succeeded: set[int] = set()
        self.failures: list[dict[str, Any]] = []
        self.first_failure_seen: float | None = None
        self.capture: str | None = None
        self.hang_detected: float | None = None
        self.capture_deadline = 0.0
        self.announced = False


class Controller:
    """See the module docstring. ``start()`` then ``join()`` (returns the result)."""

    def __init__(self, cfg: RunConfig, ident: Identity) -> None:
        self.cfg = cfg
        self.ident = ident
        self.paths = RunPaths.of(cfg.run_dir)
        self.state = load_state(self.paths.state)
        self.events = EventLog(self.paths.events, self.state.run_id, ident.job_id,
                               max(self.state.attempt, 0), cfg.step_events_per_s)
        self.lock = threading.Lock()
        self.agents: dict[int, AgentView] = {}
        self.expected = int(os.environ.get("SLURM_NTASKS") or cfg.total_nodes)
        self.phase = "gather"
        self.gen: Generation | None = None
        self.gen_count = 0
        self.spares: list[int] = []
        self.evicted: set[int] = set()
        self.plans: dict[int, dict[str, Any]] = {}
        self.failslow: FailSlowMonitor | None = None  # one per generation (recovery.py)
        self.step_times: list[float] = []
        self.last_step_time: float | None = None
        self.last_persist = 0.0
        self.result: dict[str, Any] = {}
        self.done_at: float | None = None
        self.started_at = time.time()
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        controller = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                controller._serve(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        socketserver.ThreadingTCPServer.daemon_threads = True
        self._server = socketserver.ThreadingTCPServer(("", self.cfg.controller_port), Handler)
        port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="robust-controller-server").start()
        write_json_atomic(self.paths.controller, {
            "key": self.ident.step_key, "host": host_address(), "port": port,
            "node": self.ident.node, "pid": os.getpid(), "time": time.time()}, mode=0o664)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="robust-controller")
        self._thread.start()
        log.info("controller for %s listening on port %s", self.ident.step_key, port)

    def join(self) -> dict[str, Any]:
        if self._thread is not None:
            self._thread.join()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        return dict(self.result)

    def _loop(self) -> None:
        while True:
            with self.lock:
                try:
                    self.tick(time.time())
                except Exception as exc:  # noqa: BLE001 - a controller bug must end the run visibly
                    log.exception("controller failed")
                    recovery.finish(self, "failed", f"controller error: {exc!r}")
                if self._finished():
                    return
            time.sleep(TICK_S)

    def _finished(self) -> bool:
        if self.phase != "done" or self.done_at is None:
            return False
        live = [a for a in self.agents.values() if not a.lost]
        return all(a.exit_sent for a in live) or time.time() - self.done_at > 10.0

    # ------------------------------------------------------------------ server side
    def _serve(self, sock: socket.socket) -> None:
        chan = Channel(sock, self.cfg.heartbeat_timeout_s * 3)
        view: AgentView | None = None
        try:
            while True:
                msg = chan.recv()
                with self.lock:
                    view = self.on_report(msg, time.time())
                    plan = self.plans.get(view.index, {}) if view is not None else {}
                    if plan.get("role") == "exit" and view is not None:
                        view.exit_sent = True
                chan.send({"plan": plan})
        except (OSError, ChannelClosed):
            pass
        finally:
            chan.close()
            if view is not None:
                with self.lock:
                    view.connected = False
                    view.closed_at = time.time()

    def on_report(self, msg: dict[str, Any], now: float) -> AgentView | None:
        if msg.get("key") != self.ident.step_key:
            return None
        index = int(msg["agent"])
        view = self.agents.get(index)
        if view is None:
            view = AgentView(index, str(msg["node"]), int(msg["pid"]), str(msg.get("addr")),
                             now)
            self.agents[index] = view
        view.last_seen, view.connected, view.closed_at = now, True, None
        view.gen = int(msg.get("gen", -1))
        view.states = msg.get("states") or {}
        view.stacks.update(msg.get("stacks") or {})
        gen = self.gen
        if gen is None or view.gen != gen.number:
            return view
        for item in msg.get("progress") or []:
            self.on_progress(gen, item, now)
        for ex in msg.get("exits") or []:
            key = (int(ex["gen"]), int(ex["rank"]))
            if key in view.exits_seen or ex["gen"] != gen.number:
                continue
            view.exits_seen.add(key)
            if ex.get("exit_code") == 0:
                gen.succeeded.add(int(ex["rank"]))
            else:
                gen.failures.append({**ex, "node": view.node, "agent": index, "seen": now})
                gen.first_failure_seen = gen.first_failure_seen or now
        return view

    def on_progress(self, gen: Generation, item: dict[str, Any], now: float) -> None:
        kind, rank = item.get("kind", "step"), int(item["rank"])
        if kind == "restored":
            gen.restored[rank] = (item.get("step"), item.get("tier"))
        elif kind == "final":
            gen.finals[rank] = item
        elif kind == "step":
            step = int(item["step"])
            busy = failslow.busy_of(item)
            if busy is not None and self.failslow is not None and 0 <= rank < \
                    self.cfg.world_size:
                self.failslow.record(rank, busy, now)
            gen.pending.setdefault(step, {})[rank] = item
            if len(gen.pending[step]) == self.cfg.world_size:
                self.on_step_complete(gen, step, gen.pending.pop(step), now)

    def on_step_complete(self, gen: Generation, step: int, items: dict[int, dict],
                         now: float) -> None:
        if not gen.announced:
            recovery.announce_attempt(self, gen)
        t_done = max(float(i.get("t", now)) for i in items.values())
        step_time = None
        if self.last_step_time is not None and gen.steps_done > 0:
            step_time = max(0.0, t_done - self.last_step_time)
            self.step_times.append(step_time)
            del self.step_times[:-64]
        self.last_step_time = t_done
        gen.steps_done += 1
        gen.last_progress = now
        losses = [i.get("loss") for i in items.values() if i.get("loss") is not None]
        norms = [i.get("grad_norm") for i in items.values() if i.get("grad_norm") is not None]
        loss = sum(losses) / len(losses) if losses else None
        grad_norm = max(norms) if norms else None
        self.state.last_step = step
        opened = self.state.open_incident is not None
        self.events.step(step, step_time, loss, grad_norm, force=opened or gen.steps_done == 1,
                         now=t_done)
        if opened:
            recovery.resolve_open_incident(self, gen, step, now)
        if now - self.last_persist > 1.0:
            self.persist()

    def persist(self) -> None:
        self.last_persist = time.time()
        save_state(self.paths.state, self.state)

    # ------------------------------------------------------------------ the tick
    def tick(self, now: float) -> None:
        if self.phase == "gather":
            self._gather(now)
        elif self.phase in ("running", "dumping"):
            self._check_agents(now)
            gen = self.gen
            if gen is None:
                return
            active = {r for i in gen.slots for r in self._ranks_of(i)}
            if active and active <= gen.succeeded:
                recovery.finish(self, "completed", None)
            elif gen.failures:
                # Before a pending capture: a crash or a lost node during the capture is
                # the better-localized fault, and a lost agent cannot restart in place.
                recovery.maybe_handle_failures(self, gen, now)
            elif self.phase == "dumping":
                recovery.check_capture(self, gen, now)
            elif is_hung(gen.last_progress, now, self.step_times, self.cfg.hang_floor_s,
                         self.cfg.hang_factor, gen.steps_done > 0, self.cfg.startup_timeout_s,
                         self.state.last_step is not None or bool(gen.pending)):
                recovery.start_hang_capture(self, gen, now)
            elif self.failslow is not None:
                decision = self.failslow.poll(now)
                if decision is not None:
                    recovery.handle_fail_slow(self, gen, decision, now)

    def _gather(self, now: float) -> None:
        if self.state.finished:
            recovery.finish(self, self.state.finished, self.state.verdict, write=False)
            return
        live = [a for a in self.agents.values() if not a.lost]
        waited = now - self.started_at
        if len(live) < self.expected and waited < GATHER_TIMEOUT_S:
            return
        usable = [a for a in sorted(live, key=lambda a: a.index)
                  if a.node not in self.state.blamed or waited > 5.0]
        try:
            slot_nodes, spare_nodes = assign_slots(self.state.slots,
                                                   [a.node for a in usable], self.cfg.nodes)
        except ValueError as exc:
            recovery.finish(self, "failed", f"cannot start: {exc} (agents: "
                                            f"{sorted(a.node for a in live)})")
            return
        by_node = {a.node: a.index for a in usable}
        self.spares = [by_node[n] for n in spare_nodes]
        if self.state.attempt < 0:
            self.events.run_start(slot_nodes, spare_nodes, self.cfg.world_size,
                                  {"tp": 1, "pp": 1, "dp": self.cfg.world_size},
                                  self.cfg.to_dict())
        recovery.begin_generation(self, [by_node[n] for n in slot_nodes], now)

    def _check_agents(self, now: float) -> None:
        gen = self.gen
        for view in self.agents.values():
            if view.lost:
                continue
            closed = (not view.connected and view.closed_at is not None
                      and now - view.closed_at > RECONNECT_GRACE_S)
            if closed or now - view.last_seen > self.cfg.heartbeat_timeout_s:
                view.lost = True
                log.warning("agent %s on %s lost (%s)", view.index, view.node,
                            "connection closed" if closed else "heartbeat timeout")
                if view.index in self.spares:
                    self.spares.remove(view.index)
                    continue
                if gen is not None and view.index in gen.slots:
                    gen.failures.append({
                        "rank": self._ranks_of(view.index)[0], "gen": gen.number,
                        "node": view.node, "agent": view.index, "class": "node_lost",
                        "category": "explicit", "secondary": False, "exit_code": None,
                        "signal": None, "time": view.last_seen, "seen": now,
                        "signature": None, "line": "agent heartbeat lost",
                        "evidence": {"heartbeat_age_s": round(now - view.last_seen, 3),
                                     "connection_closed": closed}})
                    gen.first_failure_seen = gen.first_failure_seen or now

    # ------------------------------------------------------------------ helpers
    def _ranks_of(self, agent_index: int) -> list[int]:
        gen = self.gen
        if gen is None or agent_index not in gen.slots:
            return []
        slot = gen.slots.index(agent_index)
        g = self.cfg.workers_per_node
        return list(range(slot * g, (slot + 1) * g))
