"""Simulated agents for ``bench scale``: one process drives many agents over real sockets.

Each simulated agent does what an agent's control loop does on the wire (protocol.py,
node/agent.py): it connects, passes the HMAC handshake with the run's secret
(auth.client_handshake), then sends a typed :class:`~slurm_robust.launcher.messages.Report`
every ``heartbeat_s`` (or the plan's ``poll_s``) naming the plan it holds, waits for the
reply, reads it with :class:`~slurm_robust.launcher.messages.Reply` ("unchanged", or
the plan in full), and applies a plan the controller pushes (dropped while a report
waits for its answer, as the agent drops it).
An active agent relays one progress line per rank per finished step, as its workers
would. No worker processes: what is measured is the controller.

Many agents share one thread: a selector waits for replies and pushes, a heap holds
the agents' next report times. The handshakes run on a small thread pool at start.

The parent (scale.py) talks to this process through lines on stdin/stdout:
``ACTIVE <t>`` (out) once every agent here holds an active plan; ``GO <window_start>
<fail_at> <end>`` (in) with absolute times; the result JSON (out) at ``end``; stdin's end
closes the connections.
"""

from __future__ import annotations

import heapq
import ipaddress
import json
import queue
import resource
import selectors
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from slurm_robust.launcher.auth import HANDSHAKE_S, client_handshake, read_run_secret
from slurm_robust.launcher.enums import Category, ProgressKind, Role
from slurm_robust.launcher.messages import BadMessage, Plan, Progress, Reply, Report, WorkerExit
from slurm_robust.launcher.protocol import Channel

#: Class and category of the injected worker failure: a crash the ladder restarts in
#: place (no spare, no requeue), so the bench measures the control plane only.
FAIL_CLASS = "worker_signal"


@dataclass
class SimAgent:
    index: int
    chan: Channel
    buf: bytes = b""
    sent_at: float | None = None  # a report waits for its reply
    next_at: float = 0.0
    plan: Plan | None = None
    gen: int = -1
    last_step: int = -1
    active_at: float | None = None
    #: (generation, time this agent first held a plan of it)
    gens: dict[int, float] = field(default_factory=dict)
    lost_plan: str | None = None  # a role telling this agent it was counted lost
    pending_exit: WorkerExit | None = None
    closed: bool = False
    plan_id: str | None = None  # the identity of ``plan`` (Reply.plan_id)


@dataclass
class Args:
    host: str
    port: int
    run_dir: str
    key: str
    first: int
    count: int
    heartbeat_s: float
    step_s: float
    fail_agent: int
    #: An answer outstanding this long: the agent gives up on its connection, closes
    #: it and reconnects (handshake again), as node/agent.py does (0: never).
    give_up_s: float = 0.0


class Harness:
    def __init__(self, a: Args) -> None:
        self.a = a
        self.secret = read_run_secret(a.run_dir)
        self.sel = selectors.DefaultSelector()
        self.agents: list[SimAgent] = []
        self.heap: list[tuple[float, int]] = []
        self.t0 = time.time()
        self.rtts: list[tuple[float, float]] = []  # (sent at, round trip)
        self.replies = 0
        self.reply_bytes = 0
        self.pushes = 0
        self.connect_failures = 0
        self.gave_up = 0
        self._checked_at = 0.0
        #: When the crash was injected, and when the report carrying it left.
        self.fail_injected_at: float | None = None
        self.fail_sent_at: float | None = None
        self.fail_gen: int | None = None
        self.joined: queue.Queue[SimAgent | ConnectionError] = queue.Queue()
        self.connected = 0
        self.closed = 0
        #: How late each report went out against its schedule: the harness's own delay,
        #: which the controller sees as a late heartbeat.
        self.lags: list[float] = []
        self.pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ set-up
    def _connect(self, index: int) -> SimAgent:
        for attempt in range(20):
            try:
                chan = self._open(index)
                client_handshake(chan, self.secret)
                return SimAgent(index, chan)
            except OSError:
                self.connect_failures += 1
                time.sleep(min(0.1 * 2 ** attempt, 2.0))
        raise ConnectionError(f"simulated agent {index} could not connect to the "
                              f"controller at {self.a.host}:{self.a.port}")

    def _open(self, index: int) -> Channel:
        """Channel.connect, but from an address of the agent's own when the controller
        listens on loopback: real agents each come from their node's address, and the
        controller bounds unauthenticated connections per source address."""
        source = None
        if ipaddress.ip_address(self.a.host).is_loopback:
            source = (f"127.10.{index // 250}.{1 + index % 250}", 0)
        timeout = 3 * HANDSHAKE_S
        sock = socket.create_connection((self.a.host, self.a.port), timeout=timeout,
                                        source_address=source)
        chan = Channel(sock, timeout)
        chan.wakeups = True  # the agent's end, as Channel.connect makes it
        return chan

    def start_connecting(self) -> None:
        """Connect every agent on a small thread pool; each starts reporting as soon as
        its handshake passed (the loop takes it from ``self.joined``), as a real agent
        does, so that a slow accept does not leave early agents silent."""
        indices = range(self.a.first, self.a.first + self.a.count)
        self.agents = [None] * self.a.count  # type: ignore[list-item]
        self.pool = ThreadPoolExecutor(max_workers=min(32, self.a.count))
        for index in indices:
            self.pool.submit(self._join, index)

    def _join(self, index: int) -> None:
        try:
            self.joined.put(self._connect(index))
        except ConnectionError as exc:
            self.joined.put(exc)

    def _take_joined(self, now: float) -> None:
        while True:
            try:
                got = self.joined.get_nowait()
            except queue.Empty:
                return
            if isinstance(got, ConnectionError):
                raise got
            i = got.index - self.a.first
            if self.agents[i] is None:
                self.connected += 1
            self.agents[i] = got
            self.sel.register(got.chan.sock, selectors.EVENT_READ, i)
            self._schedule(got, now, i)

    def _give_up_waiting(self, now: float) -> None:
        """Agents whose answer is outstanding past ``give_up_s`` close their connection
        and reconnect on the pool, keeping their plan and steps (a real agent's workers
        run on meanwhile); the new connection asks for the plan in full."""
        if self.a.give_up_s <= 0 or now - self._checked_at < 0.25:
            return
        self._checked_at = now
        for ag in self.agents:
            if ag is None or ag.closed or ag.sent_at is None \
                    or now - ag.sent_at < self.a.give_up_s:
                continue
            self.sel.unregister(ag.chan.sock)
            ag.chan.close()
            ag.closed, ag.sent_at, ag.buf, ag.plan_id = True, None, b"", None
            self.gave_up += 1
            assert self.pool is not None
            self.pool.submit(self._rejoin, ag)

    def _rejoin(self, ag: SimAgent) -> None:
        try:
            ag.chan = self._connect(ag.index).chan
        except ConnectionError as exc:
            self.joined.put(exc)
            return
        ag.closed = False
        self.joined.put(ag)

    def _schedule(self, ag: SimAgent, at: float, i: int) -> None:
        ag.next_at = at
        heapq.heappush(self.heap, (at, i))

    # ------------------------------------------------------------------ one agent
    def _report(self, ag: SimAgent, now: float) -> Report:
        progress: list[Progress] = []
        plan = ag.plan
        if plan is not None and plan.role is Role.ACTIVE and ag.active_at is not None:
            step = int((now - ag.active_at) / self.a.step_s)
            if step > ag.last_step:
                for s in range(ag.last_step + 1, step + 1):
                    progress += [Progress(rank=r, kind=ProgressKind.STEP, step=s,
                                          t=ag.active_at + (s + 1) * self.a.step_s,
                                          loss=1.0, grad_norm=1.0)
                                 for r in plan.ranks or []]
                ag.last_step = step
        exits = []
        if ag.pending_exit is not None:
            exits, ag.pending_exit = [ag.pending_exit], None
        return Report(op="report", agent=ag.index, node=f"n{ag.index}",
                      pid=100000 + ag.index, key=self.a.key, time=now,
                      addr=self.a.host, gen=ag.gen,
                      role=plan.role if plan is not None else Role.NEW,
                      exits=exits, progress=progress, plan_id=ag.plan_id)

    def _send(self, ag: SimAgent, now: float) -> None:
        report = self._report(ag, now)
        ag.chan.send(report.to_json())
        ag.sent_at = now
        if report.exits:
            # The crash's report left now: a real agent sends it the moment its worker
            # exits, so the harness's own lag before this send is not the controller's.
            self.fail_sent_at = time.time()

    def _on_line(self, i: int, ag: SimAgent, line: bytes, now: float) -> None:
        # Decoded as an agent decodes it (node/agent.py).
        reply = Reply.from_json(json.loads(line))
        if not reply.push:
            self._on_reply(i, ag, reply, len(line) + 1, now)
            return
        self.pushes += 1
        if ag.sent_at is not None:
            return  # a report waits for its answer: that answer is as new
        self._hold(ag, reply.plan, reply.plan_id, now)
        plan = reply.plan
        if plan is not None and plan.poll_s and now + plan.poll_s < ag.next_at:
            self._schedule(ag, now + plan.poll_s, i)  # the wait goes on, shorter

    def _on_reply(self, i: int, ag: SimAgent, reply: Reply, size: int, now: float) -> None:
        if ag.sent_at is not None:
            self.rtts.append((ag.sent_at, now - ag.sent_at))
        ag.sent_at = None
        self.replies += 1
        self.reply_bytes += size
        # "unchanged" stands for the plan this agent holds, and must name it.
        if reply.unchanged:
            if reply.plan_id != ag.plan_id:
                raise BadMessage(f"agent {ag.index}: 'unchanged' names {reply.plan_id!r}, "
                                 f"held {ag.plan_id!r}")
            plan = ag.plan
        else:
            plan = reply.plan
        self._hold(ag, plan, reply.plan_id, now)
        wait = plan.poll_s if plan is not None and plan.poll_s else self.a.heartbeat_s
        if ag.pending_exit is not None:
            wait = 0.0  # a worker exited while the report was out: report it at once
        self._schedule(ag, now + wait, i)

    @staticmethod
    def _hold(ag: SimAgent, plan: Plan | None, plan_id: str | None, now: float) -> None:
        ag.plan_id = plan_id
        if plan is not None:
            if plan.role in (Role.EVICTED, Role.HOLD, Role.EXIT):
                ag.lost_plan = ag.lost_plan or plan.role.value
            if plan.gen is not None and plan.gen not in ag.gens:
                ag.gens[plan.gen] = now
            if plan.role is Role.ACTIVE and plan.gen != ag.gen:
                ag.gen = plan.gen if plan.gen is not None else -1
                ag.active_at, ag.last_step = now, -1  # the new workers start stepping
            # Decoded in full above, as an agent decodes it; not kept: a real agent holds
            # one plan, this process holds one per simulated agent, and 4,096 copies of
            # a 32,768-rank list (1 GiB, 134 M references for every full garbage
            # collection to walk) made the harness, not the controller, the slow side.
            plan.rank_nodes = None
            ag.plan = plan

    def _readable(self, i: int, now: float) -> None:
        ag = self.agents[i]
        try:
            chunk = ag.chan.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""  # reset by the controller: as closed
        if not chunk:
            # The controller closed it (it ended, or refused this agent): counted, and
            # this agent is done; the others go on.
            self.sel.unregister(ag.chan.sock)
            ag.closed = True
            self.closed += 1
            return
        ag.buf += chunk
        while b"\n" in ag.buf:
            line, ag.buf = ag.buf.split(b"\n", 1)
            if not line:  # an older controller's wake-up: report now unless one waits
                if ag.sent_at is None:
                    self._schedule(ag, now, i)
                continue
            self._on_line(i, ag, line, now)

    # ------------------------------------------------------------------ the loop
    def run(self, window_start: float, fail_at: float | None, end: float,
            stdin_ok: bool) -> None:
        del window_start  # the parent cuts the window out of the samples
        announced = False
        while True:
            now = time.time()
            self._take_joined(now)
            if now >= end:
                return
            if fail_at is not None and now >= fail_at and self.fail_injected_at is None:
                self._inject(now)
            self._give_up_waiting(now)
            while self.heap and self.heap[0][0] <= now:
                at, i = heapq.heappop(self.heap)
                ag = self.agents[i]
                if at != ag.next_at or ag.sent_at is not None or ag.closed:
                    continue  # rescheduled since, or still waiting for a reply
                self.lags.append(now - at)
                self._send(ag, now)
            if not announced and stdin_ok and self.connected == self.a.count \
                    and all(a.active_at or a.closed or a.lost_plan for a in self.agents):
                print(f"ACTIVE {now}", flush=True)
                announced = True
            timeout = min(max(self.heap[0][0] - time.time(), 0.0), 0.05) if self.heap \
                else 0.05
            for key, _ in self.sel.select(timeout):
                if key.data == "stdin":
                    line = sys.stdin.readline()
                    if line.startswith("GO "):
                        _, ws, fa, en = line.split()
                        fail_at = float(fa) if float(fa) > 0 else None
                        end = float(en)
                    continue
                self._readable(key.data, time.time())

    def _inject(self, now: float) -> None:
        """The failing agent's next report carries one worker's crash."""
        for ag in self.agents:
            if ag.index == self.a.fail_agent and ag.plan is not None and ag.plan.ranks:
                ag.pending_exit = WorkerExit(
                    rank=ag.plan.ranks[0], gen=ag.gen, exit_code=1, signal=None, time=now,
                    cls=FAIL_CLASS, category=Category.EXPLICIT, line="bench: injected")
                self.fail_gen = ag.gen
                self.fail_injected_at = now
                if ag.sent_at is None:
                    self._schedule(ag, now, self.agents.index(ag))
        if self.fail_injected_at is None:
            self.fail_injected_at = -1.0  # not ours: nothing to inject here

    def result(self) -> dict[str, Any]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {"first": self.a.first, "count": self.a.count,
                "rtts": [[round(s, 4), round(r, 5)] for s, r in self.rtts],
                "replies": self.replies, "reply_bytes": self.reply_bytes,
                "pushes": self.pushes,
                "connect_failures": self.connect_failures, "closed": self.closed,
                "gave_up": self.gave_up,
                "lag_p99_ms": round(_p99(self.lags) * 1000, 1),
                "lag_max_ms": round(max(self.lags, default=0.0) * 1000, 1),
                "lost_plans": {str(a.index): a.lost_plan for a in self.agents if a.lost_plan},
                "gens": {str(a.index): {str(g): t for g, t in a.gens.items()}
                         for a in self.agents},
                "fail_sent_at": self.fail_sent_at,
                "fail_injected_at": self.fail_injected_at
                if (self.fail_injected_at or 0) > 0 else None,
                "fail_gen": self.fail_gen,
                "cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": time.time() - self.t0,
                "rss_mib_max": round(ru.ru_maxrss / 1024, 1)}


def _p99(values: list[float]) -> float:
    s = sorted(values)
    return s[int(0.99 * (len(s) - 1))] if s else 0.0


def main(argv: list[str]) -> int:
    host, port, run_dir, key, first, count, hb, step_s, fail_agent, give_up = argv
    h = Harness(Args(host, int(port), run_dir, key, int(first), int(count), float(hb),
                     float(step_s), int(fail_agent), float(give_up)))
    h.start_connecting()
    h.sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    h.run(0.0, None, float("inf"), stdin_ok=True)
    print(json.dumps(h.result()), flush=True)
    sys.stdin.read()  # keep the connections until the parent is done measuring
    for ag in h.agents:
        ag.chan.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
