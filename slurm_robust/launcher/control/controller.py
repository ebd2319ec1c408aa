"""The controller: the agents' TCP server and the run's membership.

It runs as threads inside agent 0's process: a TCP server (a thread per connection
until it passes the handshake), the report loop that then serves every agent's reports
from one thread (report_loop.py), and a tick loop. Reports and ticks work under one
lock. The
controller knows which agents exist and when each was last heard (:class:`AgentView`);
everything else, the run's phase, generation, plans, spares, run state and event log,
belongs to the recovery owner (:class:`~slurm_robust.launcher.control.recovery.Recovery`),
which the controller calls in one direction: reports in, lost agents, the clock; plans
back out to the agents. docs/ARCHITECTURE.md has the phase table.

Failover (failover.py): each controller acts under a term. A successor agent
starts one with a :class:`~slurm_robust.launcher.control.failover.Takeover`; the
membership it knows from ``state.json`` is pre-filled (the lost controller's agent as
lost) so recovery can rebuild the running generation. A controller renews its lease, and
stands down (no more plans, no more state writes) as soon as a newer term is claimed or
an agent reports one.
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Sequence
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher.auth import (
    HANDSHAKE_S,
    AuthError,
    ensure_run_secret,
    server_handshake,
)
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import cadence, failover
from slurm_robust.launcher.control.admission import PreauthGate
from slurm_robust.launcher.control.failover import StoodDown, Takeover
from slurm_robust.launcher.control.metrics import RunMetrics, serve_for_controller
from slurm_robust.launcher.control.outcome import RunOutcome
from slurm_robust.launcher.control.overload import EPISODE_S, Lateness, OverloadRecorder
from slurm_robust.launcher.control.recovery import Fence, Recovery, SlurmSide
from slurm_robust.launcher.control.replies import ReplyEncoder, incarnation
from slurm_robust.launcher.control.report_loop import Arrival, Connection, ReportLoop, detach
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.enums import Phase, Role, RunStatus
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.limits import raise_nofile_limit
from slurm_robust.launcher.messages import BadMessage, Plan, Report
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.launcher.ports import port_span
from slurm_robust.launcher.protocol import (
    MAX_UNAUTHENTICATED,
    Channel,
    ChannelClosed,
    check_report,
    host_address,
    job_node_addresses,
)
from slurm_robust.launcher.wire_records import StackSummary
from slurm_robust.records import write_json_atomic

log = logging.getLogger("slurm_robust.launcher.control.controller")

TICK_S = 0.05
#: A closed agent connection not re-opened within this long counts as a lost agent.
RECONNECT_GRACE_S = 0.5
#: An answer that took longer than this after its report arrived is late: the agent may
#: have given up on it (its socket timeout) and closed the connection, which is then no
#: evidence that its node is lost (see AgentView.close_excused).
LATE_ANSWER_S = 1.0
#: A tick loop that has not ticked for this long is frozen, not late (a deadlock, a hung
#: file system under the lock): its lease is no longer renewed and a successor takes over
#: (failover.py). Shorter stand-stills are lateness (overload.py): the lease is kept, so
#: that a slow controller is waited for instead of replaced and its node blamed. A
#: stopped or dead process renews nothing: it is replaced after a heartbeat timeout.
FROZEN_S = 30.0


def listen_backlog(agents: int) -> int:
    """The listen queue for ``agents`` connecting at once (the kernel caps it at
    net.core.somaxconn)."""
    return max(128, agents + 16)


def ephemeral_overlap(base: int,
                     path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> str | None:
    """A warning when this node's ephemeral port range (a site may have widened it)
    overlaps the rendezvous ports above ``base``: outgoing connections can then hold a
    rendezvous port and a restart's rendezvous fails now and then (EADDRINUSE)."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    top = base + port_span(base) - 1
    if top < low or base > high:
        return None
    return (f"the rendezvous ports {base}-{top} overlap this node's ephemeral port range "
            f"{low}-{high} (net.ipv4.ip_local_port_range): a restart may fail to bind its "
            "port; set master_port below the range")


class AgentView:
    """What the controller knows of one agent (recovery reads it as a ``Member``)."""

    def __init__(self, index: int, node: str, pid: int, addr: str, now: float) -> None:
        self.index, self.node, self.pid, self.addr = index, node, pid, addr
        self.last_seen = now
        self.connected = True
        self.closed_at: float | None = None
        self.lost = False
        self.gen = -1
        self.stacks: dict[str, StackSummary] = {}
        self.states: dict[str, str | None] = {}
        self.exit_sent = False
        #: False for an agent a successor knows only from state.json, until it reports.
        self.heard = True
        #: Its open connection, for plan pushes (protocol.py); None between connections.
        self.conn: Connection | None = None
        #: When a report of its arrived that the controller has not answered yet (set by
        #: the report loop before it waits for the lock): the agent is alive and
        #: the controller is the one late, so the heartbeat timeout does not run.
        self.pending_since: float | None = None
        #: Its last connection closed while the controller was late (an agent that gave
        #: up waiting for an answer closes it): no evidence of a lost node, so only the
        #: heartbeat timeout on the controller's responsive time applies.
        self.close_excused = False


class Controller:
    """See the module docstring. ``start()`` then ``join()`` (returns the result)."""

    def __init__(self, cfg: RunConfig, ident: Identity, slurm: SlurmSide | None = None,
                 takeover: Takeover | None = None) -> None:
        # The heartbeat and its timeout for this many agents, as the agents derive them.
        cfg = cadence.scaled(cfg)
        self.cfg = cfg
        self.ident = ident
        self.paths = RunPaths.of(cfg.run_dir)
        self.lock = threading.Lock()
        self.agents: dict[int, AgentView] = {}
        # Failover: the term this controller acts under and its fence (superseded).
        self.takeover = takeover
        state = load_state(self.paths.state)
        self.term = takeover.term if takeover else state.term + 1
        # Live metrics: kept from the start, served once start() binds the endpoint.
        self.metrics = RunMetrics(ident.job_id, state.run_id)
        #: The tick loop's lateness: not counted against the agents (overload.py).
        self.lateness = Lateness(time.time())
        #: Seconds without a tick after which the lease lapses (FROZEN_S).
        self.frozen_s = FROZEN_S
        self.recovery = Recovery(cfg, ident, self.agents,
                                 expected=int(os.environ.get("SLURM_NTASKS")
                                              or cfg.total_nodes), slurm=slurm,
                                 state=state, fence=Fence(self.term, self.superseded),
                                 takeover=takeover, metrics=self.metrics,
                                 elapsed=self.lateness.elapsed)
        self.overload = OverloadRecorder(self.recovery.events.controller_overload,
                                         self.metrics.on_lateness)
        self.recovery.events.before_end.append(
            lambda now: self.overload.flush(now, len(self.agents)))
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None
        #: Every authenticated connection's reports, from one thread (report_loop.py).
        self._reports = ReportLoop(self._serve_batch, self._connection_ended,
                                   lambda plans: self.replies.encode_pushes(plans),
                                   self._pushed)
        # Channel security (docs/SECURITY.md): the run secret for the handshake,
        # the job's own node addresses for the accept check, and a cap on connections.
        self.secret = ensure_run_secret(cfg.run_dir)
        self.allowed = job_node_addresses(os.environ.get("SLURM_JOB_NODELIST"),
                                          host_address())
        #: Authenticated connections at most, and unauthenticated ones in all.
        self.max_connections = 2 * max(self.recovery.expected, cfg.total_nodes) + 4
        self.connections = 0  # authenticated
        self._conn_lock = threading.Lock()  # for the count: a frozen loop must not block it
        self.preauth = PreauthGate()
        self.stood_down = False
        #: recovery.push_token() when plans were last pushed to the agents.
        self._pushed_at_token: tuple[int, bool] | None = None
        #: Set by a report that leaves a decision to make: the tick runs at once.
        self._tick_now = threading.Event()
        # Plans it hands out are named by this incarnation: no other controller (a
        # predecessor, a successor) can answer "unchanged" to them (replies.py).
        self.replies = ReplyEncoder(incarnation(self.term))
        if takeover is not None:
            self._prefill(takeover, time.time())

    def _prefill(self, takeover: Takeover, now: float) -> None:
        """The membership a successor knows from state.json: survivors are waited for
        (``heard`` False until they report), the lost controller's agent is lost."""
        members = dict(self.recovery.state.members)
        if takeover.lost_agent is not None and takeover.lost_node:
            members.setdefault(str(takeover.lost_agent), takeover.lost_node)
        for key, node in members.items():
            view = AgentView(int(key), node, 0, "", now)
            view.connected, view.heard = False, False
            view.lost = int(key) == takeover.lost_agent
            if view.lost and takeover.last_heard is not None:
                view.last_seen = takeover.last_heard  # the incident's fault time
            self.agents[int(key)] = view

    def superseded(self) -> bool:
        """Whether a newer term has been claimed (this controller must not act)."""
        return self.stood_down or failover.superseded(self.paths, self.ident.step_key,
                                                      self.term)

    def stand_down(self, why: str) -> None:
        """Stop acting for good: no plans, no state writes; the agents follow the newer
        controller through controller.json."""
        if not self.stood_down:
            log.warning("controller term %s on %s stands down: %s", self.term,
                        self.ident.node, why)
        self.stood_down = True
        self.recovery.result = RunOutcome(RunStatus.STOOD_DOWN, term=self.term)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        controller = self
        # One descriptor per agent connection (the agent that hosts us raised it
        # already; a controller started elsewhere must not stop at the soft 1024).
        raise_nofile_limit()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                controller._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True
            # Every agent connects at once when the job starts (and again after a
            # failover): socketserver's default backlog of 5 overflowed, and each
            # dropped SYN cost its agent a 1 s, then 3 s retransmit.
            request_queue_size = listen_backlog(self.max_connections)

            def verify_request(self, request: Any, client_address: Any) -> bool:
                return controller._admit(client_address[0])

        # The job node's own address, never 0.0.0.0 (other networks need not reach it).
        self._server = Server((host_address(), self.cfg.controller_port), Handler)
        port = self._server.server_address[1]
        if self.takeover is None and not failover.claim_term(
                self.paths, self.ident.step_key, self.term,
                {"agent": self.ident.index, "node": self.ident.node}):
            raise RuntimeError(f"controller term {self.term} of {self.ident.step_key} is "
                               "already claimed; is another controller running?")
        self.recovery.persist()  # the term is in state.json before any plan
        failover.renew_lease(self.paths, self.term)
        self._reports.start()
        threading.Thread(target=self._server.serve_forever, daemon=True,
                         name="robust-controller-server").start()
        write_json_atomic(self.paths.controller, {
            "key": self.ident.step_key, "host": host_address(), "port": port,
            "node": self.ident.node, "pid": os.getpid(), "time": time.time(),
            "agent": self.ident.index, "term": self.term}, mode=0o600)
        if self.takeover is not None:  # the first controller is implied by run_start
            self.recovery.events.controller(self.term, self.ident.node, self.ident.index,
                                            self.takeover.evidence)
        # Live metrics on this node's address; phase and spares are read at scrape time.
        rec = self.recovery
        serve_for_controller(self.metrics, self.cfg.run_dir, host_address())
        self.metrics.watch(phase=lambda: rec.phase, spares_parked=lambda: len(rec.spares),
                           spares_used=lambda: len(rec.evicted))
        # Lateness counts from the loop's start, not from this object's construction.
        self.lateness.last_beat = time.time()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="robust-controller")
        self._thread.start()
        threading.Thread(target=self._keep_lease, daemon=True,
                         name="robust-controller-lease").start()
        log.info("controller for %s listening on port %s", self.ident.step_key, port)
        overlap = ephemeral_overlap(self.cfg.master_port)
        if overlap:
            log.warning("%s", overlap)

    def join(self) -> RunOutcome | None:
        if self._thread is not None:
            self._thread.join()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        rec = self.recovery
        self.metrics.close()  # stop serving, withdraw the discovery target
        if rec.phase is Phase.DONE and rec.batch_lost:
            # Last, once every agent has had its exit plan: this ends the job, and this
            # process with it.
            log.warning("job %s: the batch node was lost and the run has ended; cancelling "
                        "the job (Slurm would keep it running)", self.ident.job_id)
            try:
                rec.slurm.cancel(self.ident.job_id)
            except SlurmRobustError as exc:
                log.error("could not cancel job %s: %s; scancel it", self.ident.job_id, exc)
        return rec.result

    def alive(self) -> bool:
        """Whether the tick loop still runs (its own agent waits for a live, slow controller)."""
        return self._thread is not None and self._thread.is_alive()

    def _keep_lease(self) -> None:
        """Renew the lease while the tick loop runs and is not frozen (FROZEN_S).

        Its own thread, outside the lock: a tick that holds the lock for seconds is a late
        controller, and a lapsed lease would have a successor take over and blame its
        node. A stopped process (SIGSTOP) or a dead one renews nothing."""
        while self._thread is not None and self._thread.is_alive():
            if time.time() - self.lateness.last_beat < self.frozen_s \
                    and not self.superseded():
                try:
                    failover.renew_lease(self.paths, self.term)
                except OSError as exc:  # the next renewal tries again
                    log.warning("could not renew the controller lease: %s", exc)
            time.sleep(failover.LEASE_RENEW_S)

    def _loop(self) -> None:
        while True:
            with self.lock:
                if self.superseded():
                    self.stand_down("a newer controller term was claimed")
                    return
                try:
                    now = time.time()
                    # How late this tick is: that time is not the agents' silence.
                    self.overload.note(self.lateness.beat(now), now, len(self.agents))
                    self.tick(now)
                except StoodDown as exc:
                    self.stand_down(str(exc))
                    return
                except Exception as exc:  # noqa: BLE001 - a controller bug must end the run visibly
                    log.exception("controller failed")
                    self.recovery.fail(f"controller error: {exc!r}")
                self._push_plans(None)
                if self._finished():
                    return
            self._tick_now.wait(TICK_S)
            self._tick_now.clear()

    def _finished(self) -> bool:
        done_at = self.recovery.done_at
        if self.recovery.phase is not Phase.DONE or done_at is None:
            return False
        live = [a for a in self.agents.values() if not a.lost]
        return all(a.exit_sent for a in live) or time.time() - done_at > 10.0

    # ------------------------------------------------------------------ server side
    def _admit(self, addr: str) -> bool:
        """Accept check: a job node's address. (Unauthenticated connections are bounded
        by ``self.preauth``, authenticated ones by ``max_connections``.)"""
        if self.allowed and addr not in self.allowed:
            log.warning("refused a controller connection from %s: not a node of this "
                        "job", addr)
            return False
        return True

    def _handshake(self, chan: Channel, sock: socket.socket, peer: str) -> None:
        """The peer proves it holds the run secret (AuthError, ChannelClosed if not)."""
        self.preauth.enter(peer, sock, self.max_connections)
        # One total deadline and a small message bound until the peer has proved it
        # holds the secret, so that strangers cannot hold threads and descriptors.
        with chan.bounded(HANDSHAKE_S, MAX_UNAUTHENTICATED):
            # A frozen controller (its loop holding the lock) must pass no handshake:
            # an agent takes a completed one as proof that the controller answers
            # (Agent.controller_lost), so a frozen one would never be replaced.
            if not self.lock.acquire(timeout=HANDSHAKE_S):
                raise ChannelClosed("the controller is not answering")
            self.lock.release()
            server_handshake(chan, self.secret)
        self.preauth.leave(sock)

    def _serve(self, sock: socket.socket) -> None:
        """A new connection, in its own thread until it has passed the handshake; then
        the report loop serves it (report_loop.py) and this thread ends."""
        chan = Channel(sock, self.cfg.heartbeat_timeout_s * 3)
        peer = "?"
        counted = False
        try:
            peer = str(sock.getpeername()[0])
            self._handshake(chan, sock, peer)
            with self._conn_lock:
                if self.connections >= self.max_connections:
                    log.warning("refused an authenticated controller connection from %s: "
                                "%d open (the cap)", peer, self.connections)
                    return
                self.connections += 1
                counted = True
            # socketserver closes the socket it handed the handler when the handler
            # returns: the loop gets the connection under a socket object of its own.
            chan.sock = detach(sock)
            self._reports.add(Connection(chan, peer, counted))
            return
        except (AuthError, BadMessage) as exc:
            log.warning("closed the controller connection from %s (not yet an agent): %s",
                        peer, exc)
        except (OSError, ChannelClosed):
            pass
        finally:
            self.preauth.leave(sock)
        self._closed(None, chan, counted)

    def _serve_batch(self, batch: Sequence[Arrival]) -> list[bytes | None]:
        """One round of the report loop: each report checked and decoded, then all of
        them answered under one acquisition of the lock; the reply bytes for each (None:
        close that connection)."""
        replies: list[bytes | None] = [None] * len(batch)
        decoded: list[tuple[int, Report, AgentView | None]] = []
        refused: set[Connection] = set()
        for i, arrival in enumerate(batch):
            conn = arrival.conn
            if conn in refused:
                continue
            # Marked before the report is checked and decoded (CPU a starved process may
            # take long over), without the lock: the tick sees the agent as heard.
            index = arrival.raw.get("agent")
            sender = self.agents.get(index) if type(index) is int else None
            if sender is not None:
                sender.pending_since = arrival.arrived
            try:
                # Ranges and list bounds first (they need the world size), then the
                # typed message; either refuses at the boundary with BadMessage.
                check_report(arrival.raw, self.cfg.world_size)
                decoded.append((i, Report.from_json(arrival.raw), sender))
            except BadMessage as exc:
                # Refused at the boundary: this connection ends, the run goes on (an
                # agent that reconnects with good reports is heard again).
                log.warning("closed the controller connection from %s (%s): %s", conn.peer,
                            conn.view.node if conn.view else "not yet an agent", exc)
                refused.add(conn)
                if sender is not None:
                    sender.pending_since = None
        answers: dict[int, tuple[AgentView | None, Plan | None] | None] = {}
        with self.lock:
            for i, report, _ in decoded:
                if batch[i].conn not in refused:
                    answers[i] = self._answer(report, batch[i].conn)
        for i, report, sender in decoded:
            answer = answers.get(i)
            conn = batch[i].conn
            if answer is not None:
                conn.view = answer[0]
                replies[i], conn.plan_id = self.replies.encode_identified(answer[1],
                                                                          report.plan_id)
                if answer[0] is not None:
                    # The agent's heartbeat clock restarts once it has the answer (the
                    # loop writes it next); then the mark goes, in this order, so the
                    # tick always sees one or the other.
                    answer[0].last_seen = max(answer[0].last_seen, time.time())
            if sender is not None:
                sender.pending_since = None
            conn.late = time.time() - batch[i].arrived > LATE_ANSWER_S
        return replies

    def _connection_ended(self, conn: Connection, why: str) -> None:
        log.debug("controller connection from %s (%s) ended: %s", conn.peer,
                  conn.view.node if conn.view else "not yet an agent", why)
        self._closed(conn.view, conn.chan, conn.counted, conn.late, conn)

    def _answer(self, report: Report, conn: Connection
                ) -> tuple[AgentView | None, Plan | None] | None:
        """One report, under the lock: the reporting agent's view and plan (None: this
        controller was replaced and must not answer)."""
        if report.term > self.term:
            self.stand_down(f"agent {report.agent} reports term {report.term}")
        if self.superseded():
            return None
        view = self.on_report(report, time.time())
        plan = self._plan_for(view)
        if plan is not None and plan.role is Role.EXIT and view is not None:
            view.exit_sent = True
        if view is not None:
            view.conn = conn
        self._push_plans(view)
        if self.recovery.decision_pending():
            self._tick_now.set()
        return view, plan

    def _closed(self, view: AgentView | None, chan: Channel, counted: bool,
                late: bool = False, conn: Connection | None = None) -> None:
        """A connection ended: its agent gets no push on it and counts as closed
        (``counted``: it was an authenticated connection, one of the capped ones; ``conn``:
        the report loop's, once the connection was handed to it).

        A close is evidence of a lost node (the kernel closes a dead agent's sockets)
        unless the controller was late meanwhile: its last answer on this connection was
        (``late``), or its tick loop was since it last answered the agent. An agent that
        waited in vain closes its connection and reconnects once the controller answers
        again; it is then judged by the heartbeat timeout on responsive time."""
        if counted:
            with self._conn_lock:
                self.connections -= 1
        with self.lock:
            if view is not None and conn is not None and view.conn is conn:
                view.conn = None  # no push on a closed connection
        chan.close()
        if view is not None:
            with self.lock:
                now = time.time()
                view.connected = False
                view.closed_at = now
                view.close_excused = late or \
                    self.lateness.late_between(view.last_seen, now) >= EPISODE_S

    def _push_plans(self, answered: AgentView | None) -> None:
        """Once plans changed since the last push, push every connected agent but
        ``answered`` (its answer carries the plan) its plan, so that a decision reaches
        the agents in one write each instead of at their heartbeat, and without a
        report from each first (4,096 reports to serve before the last
        agent had the decision). The report loop encodes and writes them, skipping an
        agent whose last plan written was this one; the caller holds the lock."""
        token = self.recovery.push_token()
        if token == self._pushed_at_token:
            return
        self._pushed_at_token = token
        pushes = []
        for view in self.agents.values():
            conn = view.conn
            if view is not answered and conn is not None and not self._fenced(view):
                plan = self.recovery.plan_for(view.index)
                if plan is not None:
                    pushes.append((conn, plan))
        self._reports.push(pushes)

    @staticmethod
    def _pushed(conn: Connection, plan: Plan) -> None:
        """A pushed plan went out (the report loop's thread): an exit counts as told, as
        in an answer (_finished waits for every agent to be told)."""
        if plan.role is Role.EXIT and conn.view is not None:
            conn.view.exit_sent = True

    def on_report(self, report: Report, now: float) -> AgentView | None:
        """Membership from one report; its progress and exits go to recovery. The
        agent's heartbeat clock restarts at ``now``, when it is answered: it cannot
        report again before it has the answer (time a report waits for the controller is
        covered by ``pending_since`` and Channel.has_input, see _check_agents)."""
        if report.key != self.ident.step_key:
            return None  # an agent of an earlier allocation of this job
        view = self.agents.get(report.agent)
        if view is not None and self._fenced(view):
            return view  # heard again after it was declared lost: nothing it says counts
        if view is None:
            view = AgentView(report.agent, report.node, report.pid, str(report.addr), now)
            self.agents[report.agent] = view
        view.last_seen, view.connected, view.closed_at = max(view.last_seen, now), True, None
        view.close_excused = False
        view.heard, view.pid = True, report.pid
        if report.addr:
            view.addr = str(report.addr)
        view.gen = report.gen
        view.states = report.states
        view.stacks.update(report.stacks)
        if report.warned is not None:
            self.recovery.on_time_limit(view, report.warned)
        if report.ending is not None:
            self.recovery.on_ending(view, report.ending)
        self.recovery.on_report(view, view.gen, report.progress, report.exits, now,
                                diagnoses=report.diagnoses)
        if report.findings or report.sample is not None:  # in-job monitor
            self.recovery.on_findings(view, report.findings, report.sample, now)
        return view

    @staticmethod
    def _report_waiting(view: AgentView) -> bool:
        """Whether a report of this agent has arrived and waits for the controller: read
        and waiting for the lock (``pending_since``), or still in the socket, its
        report loop not yet at it. Such an agent is alive; the controller is
        the one late, and a slow controller must blame no node."""
        if view.pending_since is not None:
            return True
        conn = view.conn
        return conn is not None and conn.chan.has_input()

    def _fenced(self, view: AgentView) -> bool:
        """Fencing: an agent declared lost (a partitioned node whose link came
        back) belongs to a generation that is gone and its slot to another node; it is
        told to stand down, and its reports feed nothing. Never agent 0's own node."""
        return view.lost and view.node != self.ident.node

    def _plan_for(self, view: AgentView | None) -> Plan | None:
        if view is None:
            return None
        if self._fenced(view):
            if not view.exit_sent:
                log.warning("agent %s on %s reported after it was declared lost (gen %s); "
                            "told to stand down", view.index, view.node, view.gen)
            return Plan(role=Role.EXIT, exit_code=0)
        return self.recovery.plan_for(view.index)

    # ------------------------------------------------------------------ the tick
    def tick(self, now: float) -> None:
        if self.recovery.phase in (Phase.RUNNING, Phase.DUMPING, Phase.DIAGNOSING,
                                   Phase.REPLAYING):
            self._check_agents(now)
        self.recovery.tick(now)

    def _check_agents(self, now: float) -> None:
        """Agents lost: a connection closed and not re-opened within RECONNECT_GRACE_S,
        or silence for longer than the heartbeat timeout. Both are measured on the
        controller's responsive time (overload.py): the time its own loop was late does
        not count, so a slow controller blames no node and a healthy one still notices a
        dead one within the timeout."""
        elapsed, timeout = self.lateness.elapsed, self.cfg.heartbeat_timeout_s
        for view in self.agents.values():
            if view.lost:
                continue
            # The wall time first: responsive time is never longer, and most agents were
            # heard within it (one cheap test each per tick, thousands of agents).
            closed = (not view.connected and view.closed_at is not None
                      and not view.close_excused
                      and now - view.closed_at > RECONNECT_GRACE_S
                      and elapsed(view.closed_at, now) > RECONNECT_GRACE_S)
            silent = now - view.last_seen > timeout \
                and elapsed(view.last_seen, now) > timeout \
                and not self._report_waiting(view)
            if closed or silent:
                view.lost = True
                log.warning("agent %s on %s lost (%s)", view.index, view.node,
                            "connection closed" if closed else "heartbeat timeout")
                self.recovery.on_agent_lost(view, closed, now)
