"""The run's configuration: one frozen dataclass, checked at construction.

A :class:`RunConfig` travels from ``submit``/``launch``/the Python executor to every
agent (pickled by submitit, or as ``<run_dir>/config.json`` for ``launch``), so every
agent, the controller and the workers act on the same values.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict, cast

from slurm_robust.errors import UsageError
from slurm_robust.launcher.enums import WorkPhase
from slurm_robust.launcher.ports import EPHEMERAL_FIRST, PORT_BUCKET, port_span
from slurm_robust.scriptenv import is_python
from slurm_robust.stacks.failslow import FailSlowOptions

SPARES_ENV = "SLURM_ROBUST_SPARES"
HANG_TIMEOUT_ENV = "SLURM_ROBUST_HANG_TIMEOUT"
MAX_RESTARTS_ENV = "SLURM_ROBUST_MAX_RESTARTS"
CKPT_EVERY_ENV = "SLURM_ROBUST_CKPT_EVERY"
_DECIMAL = re.compile(r"^(0|[1-9][0-9]{0,8})$")


class RunConfigRecord(TypedDict):
    """``config.json``: a RunConfig as the submitter writes it, one key per field in the
    field order (tuples as lists)."""

    command: list[str]
    run_dir: str
    nodes: int
    spares: int
    workers_per_node: int
    hang_floor_s: float
    hang_factor: float
    hang_limits: dict[str, float]
    startup_timeout_s: float
    heartbeat_s: float
    heartbeat_timeout_s: float
    max_restarts: int
    warn_before_s: float
    max_no_progress: int
    outage_budget_s: float
    outage_backoff_s: float
    outage_backoff_max_s: float
    node_failures_to_blame: int
    max_blamed_nodes: int | None
    spike_factor: float
    step_events_per_s: float
    local_every: int
    durable_every: int
    peer_backup: bool
    peer_slots: int
    master_port: int
    controller_port: int
    site_config: str | None
    env: dict[str, str]
    stack_method: str
    grace_s: float
    drain: bool
    prewarm: list[str]
    fail_slow: bool
    fail_slow_interval_s: float
    fail_slow_window: int
    fail_slow_min_votes: int
    fail_slow_factor: float
    fail_slow_min_excess_s: float
    resume_args: list[str]
    resume_if_exists: str | None
    auto_steps: bool
    nan_policy: str
    on_shortfall: str


@dataclass(frozen=True)
class RunConfig:
    """What to run and how to keep it running.

    Attributes:
        command: the worker command line (argv), run once per rank.
        run_dir: the run directory on a filesystem every node sees (event log, state,
            logs, verdicts, stacks, durable checkpoints).
        nodes: nodes that run workers (N).
        spares: parked spare nodes allocated with the job (k); the job has N + k nodes.
        workers_per_node: ranks per node (GPUs per node on GPU clusters, 1 on CPU).
        hang_floor_s: a hang is declared after max(hang_floor_s, hang_factor x median
            step time) without a finished step.
        hang_factor: see hang_floor_s. These two are the whole rule for a run whose
            workers never declare a phase; once they do (``run.section``, the Lightning
            and Hugging Face callbacks), each phase has its own limit
            (launcher/control/phases.py) and these apply only to the first steps of a
            started group, until step times are known.
        hang_limits: explicit hang limits in seconds per phase (``startup``, ``steps``,
            ``eval``, ``save``, ``section`` for every user section, ``section:NAME``,
            ``finishing``), replacing the learned ones.
        startup_timeout_s: longest wait for the first step of a (re)started worker group,
            once the run has ever reported a step; a script that never reports steps is
            never judged hung (only exits, heartbeats and the live inspection apply).
        heartbeat_s: how often agents report to the controller while they are few;
            past 1,000 x heartbeat_s agents (nodes and spares) the interval grows with
            them, 1,000 reports a second in all (control/cadence.py).
        heartbeat_timeout_s: an agent silent this long is lost (its node is blamed); at
            least five heartbeats once the heartbeat grows.
        warn_before_s: act this long before the job's time limit (requeue with the newest
            step): on Slurm's warning signal (``submit`` asks for it) or when the job's end
            time, read from Slurm once a minute, is that close, whichever comes first.
        max_restarts: restart budget across in-job restarts and Slurm requeues.
        max_no_progress: attempts in a row that finish no new step before the run stops.
        outage_budget_s: how long an external service (a model hub, an object store) may
            stay down at start-up: attempts that fail before their first step with
            ``external_service`` or ``remote_storage`` count against this instead of
            max_no_progress and max_restarts (launcher/control/outage.py); once the outage
            has lasted this long the run stops with a verdict naming the service.
        outage_backoff_s, outage_backoff_max_s: the wait before each such restart: the
            first, doubling each time up to the second.
        node_failures_to_blame: worker failures on one node (in one run) that blame it.
        max_blamed_nodes: the most nodes one run may blame (and so drain, and replace by
            spares) over its life; null means the run's node count (nodes + spares: a
            job never drains more nodes than it holds). A fault that would blame more
            stops the run with a verdict instead (a runaway or hostile job must not drain
            the cluster). The reserve caps the same on its side (``reserve.job_blame_cap``).
        spike_factor: a loss or grad norm above spike_factor x the recent median is a spike.
        step_events_per_s: at most this many step events a second (sampled beyond it).
        local_every, durable_every: node-local / durable checkpoint cadence in steps
            (0: never); the memory tier and the peer backup run every step.
        peer_backup: keep each rank's snapshot also on a peer node.
        peer_slots: backup buffers per peer (2: a node lost while its newest backup is in
            flight still leaves the previous one; 1 halves that memory but opens the window).
        master_port: base TCP port of the workers' rendezvous; each job uses its own
            block of ports above it and each attempt a fresh one (see
            ports.rendezvous_port), kept below the ephemeral port range (32768 on).
        controller_port: TCP port of the controller (0: any free port).
        site_config: path of the site config (node-local roots); None: the default lookup.
        env: extra environment for the workers.
        stack_method: ``auto``, ``py-spy`` or ``faulthandler`` (see slurm_robust.stacks).
        grace_s: SIGTERM-to-SIGKILL grace when stopping workers.
        prewarm: modules the agent's fork server imports once, before any worker needs
            them; every worker is a fork of it (see node/forkserver.py); empty: start
            every worker with a plain exec.
        drain: also drain blamed nodes directly (needs a Slurm operator account; the
            verdict file is written either way).
        fail_slow: detect a persistently slow rank from the ``busy_s`` the training API
            reports (``with run.busy():``) and evict its node like a node fault.
        fail_slow_interval_s: seconds per round (ByteRobust: 10).
        fail_slow_window, fail_slow_min_votes: a node flagged slowest in at least
            min_votes of the last window rounds (and more often than any other) is evicted.
        fail_slow_factor: a rank is slow above this multiple of the median busy time.
        fail_slow_min_excess_s: and at least this many seconds above it. Scheduler jitter
            on a shared host reaches tens of ms, which is 1.5x a step of tens of ms; a
            slow machine under a real step costs far more than the 50 ms default.
        resume_args: arguments appended to the command from the first restart on (a
            script with its own checkpoints, e.g. ``("--init_from=resume",)``).
        resume_if_exists: append resume_args only when this file exists (relative to the
            run's working directory); None: always from the first restart on.
        auto_steps: run a Python command under ``python -m slurm_robust.autosteps`` (an
            optimizer step hook reports steps; see slurm_robust/autosteps.py).
        nan_policy: a NaN that comes back at the same step and origin after a replay is
            the data or the model: ``stop`` the run with a verdict, or ``skip`` that
            batch and continue (control/nan_ladder.py).
        on_shortfall: a requeue whose exclusions leave the partition and the reserve too
            few nodes: ``shrink`` (requeue with fewer spares when the world still fits,
            else stop), ``stop`` (stop with a verdict) or ``wait`` (pend, visibly); see
            slurm_robust/launcher/control/shortfall.py.
    """

    command: tuple[str, ...]
    run_dir: str
    nodes: int = 1
    spares: int = 0
    workers_per_node: int = 1
    hang_floor_s: float = 20.0
    hang_factor: float = 10.0
    hang_limits: dict[str, float] = field(default_factory=dict)
    startup_timeout_s: float = 1800.0
    heartbeat_s: float = 0.2
    heartbeat_timeout_s: float = 4.0
    max_restarts: int = 10
    warn_before_s: float = 60.0
    max_no_progress: int = 3
    outage_budget_s: float = 1800.0
    outage_backoff_s: float = 10.0
    outage_backoff_max_s: float = 300.0
    node_failures_to_blame: int = 3
    max_blamed_nodes: int | None = None
    spike_factor: float = 5.0
    step_events_per_s: float = 50.0
    local_every: int = 10
    durable_every: int = 20
    peer_backup: bool = True
    peer_slots: int = 2
    master_port: int = 29500
    controller_port: int = 0
    site_config: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    stack_method: str = "auto"
    grace_s: float = 1.0
    drain: bool = False
    # torch._dynamo: the first optimizer a script builds imports it (0.8-2 s here, sympy
    # included), which was most of an in-place restart before it was pre-imported.
    # slurm_robust.train: the training API (torch.distributed's FSDP and checkpoint
    # modules with it, about 0.2 s of CPU), imported by every wrapped script's start.
    prewarm: tuple[str, ...] = ("torch", "torch._dynamo", "slurm_robust.train")
    fail_slow: bool = True
    fail_slow_interval_s: float = 10.0
    fail_slow_window: int = 5
    fail_slow_min_votes: int = 3
    fail_slow_factor: float = 1.5
    fail_slow_min_excess_s: float = 0.05
    resume_args: tuple[str, ...] = ()
    resume_if_exists: str | None = None
    auto_steps: bool = False
    nan_policy: str = "stop"
    on_shortfall: str = "shrink"

    def __post_init__(self) -> None:
        if not self.command:
            raise UsageError("no worker command given; put it after `--`, e.g. "
                             "`slurm-robust submit --nodes 2 -- python train.py`")
        object.__setattr__(self, "command", tuple(str(a) for a in self.command))
        object.__setattr__(self, "run_dir", str(Path(self.run_dir).absolute()))
        object.__setattr__(self, "prewarm", tuple(self.prewarm))
        object.__setattr__(self, "resume_args", tuple(str(a) for a in self.resume_args))
        if self.resume_if_exists is not None and not self.resume_args:
            raise UsageError("resume_if_exists needs resume_args (e.g. --resume-args "
                             "'--init_from=resume')")
        if self.auto_steps and not (len(self.command) > 1 and is_python(self.command[0])):
            raise UsageError("--auto-steps needs a Python command, e.g. `-- python "
                             f"train.py`; got {' '.join(self.command)!r}")
        for name in ("nodes", "workers_per_node"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} is {getattr(self, name)}; use >= 1")
        for name in ("spares", "max_restarts", "local_every", "durable_every"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} is {getattr(self, name)}; use >= 0")
        if self.max_no_progress < 1 or self.node_failures_to_blame < 1 \
                or (self.max_blamed_nodes is not None and self.max_blamed_nodes < 1):
            raise UsageError("max_no_progress, node_failures_to_blame and max_blamed_nodes "
                             "must be >= 1")
        self._check_outage()
        if self.hang_floor_s <= 0 or self.hang_factor <= 0 or self.startup_timeout_s <= 0:
            raise UsageError("hang_floor_s, hang_factor and startup_timeout_s must be > 0")
        self._check_hang_limits()
        if not 0 < self.heartbeat_s < self.heartbeat_timeout_s:
            raise UsageError(f"need 0 < heartbeat_s ({self.heartbeat_s}) < "
                             f"heartbeat_timeout_s ({self.heartbeat_timeout_s})")
        if self.warn_before_s <= 0:
            raise UsageError(f"warn_before_s is {self.warn_before_s}; use > 0")
        if self.spike_factor <= 1:
            raise UsageError(f"spike_factor is {self.spike_factor}; use > 1")
        if self.master_port < 1024 or port_span(self.master_port) < PORT_BUCKET:
            raise UsageError(f"master_port {self.master_port} is outside 1024.."
                             f"{65536 - PORT_BUCKET} (a base below {EPHEMERAL_FIRST} keeps "
                             "the rendezvous out of the ephemeral port range)")
        if self.on_shortfall not in ("shrink", "stop", "wait"):
            raise UsageError(f"on_shortfall {self.on_shortfall!r}: use shrink, stop or wait")
        if self.stack_method not in ("auto", "py-spy", "faulthandler"):
            raise UsageError(f"stack_method {self.stack_method!r}: use auto, py-spy "
                             "or faulthandler")
        if self.nan_policy not in ("stop", "skip"):
            raise UsageError(f"nan_policy {self.nan_policy!r}: use stop or skip")
        self.fail_slow_options()  # raises UsageError on bad thresholds

    def _check_outage(self) -> None:
        for name in ("outage_budget_s", "outage_backoff_s", "outage_backoff_max_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise UsageError(f"{name} is {value}; use seconds >= 0")
        if self.outage_backoff_s > self.outage_backoff_max_s:
            raise UsageError(f"outage_backoff_s ({self.outage_backoff_s:g}) is above "
                             f"outage_backoff_max_s ({self.outage_backoff_max_s:g})")

    def _check_hang_limits(self) -> None:
        phases = {p.value for p in WorkPhase}
        for key, value in self.hang_limits.items():
            name = key.removeprefix("section:")
            if not (key in phases or (key.startswith("section:") and name)):
                raise UsageError(f"hang limit for {key!r}: use one of {sorted(phases)} "
                                 "or section:NAME")
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise UsageError(f"hang limit for {key!r} is {value!r}; use seconds > 0")

    def fail_slow_options(self) -> FailSlowOptions:
        """The fail-slow vote's thresholds for this run's world size.

        One slow rank is always allowed to count as one fault: the library's default
        share (a quarter of the ranks) would otherwise flag nothing in a world of 3.
        """
        share = max(FailSlowOptions.max_slow_fraction, min(0.5, 1.5 / self.world_size))
        return FailSlowOptions(interval_s=self.fail_slow_interval_s,
                               window=self.fail_slow_window,
                               min_votes=self.fail_slow_min_votes,
                               slow_factor=self.fail_slow_factor,
                               min_excess_s=self.fail_slow_min_excess_s,
                               max_slow_fraction=share)

    @property
    def world_size(self) -> int:
        return self.nodes * self.workers_per_node

    @property
    def total_nodes(self) -> int:
        return self.nodes + self.spares

    def to_dict(self) -> RunConfigRecord:
        out = asdict(self)
        out["command"] = list(self.command)
        out["prewarm"] = list(self.prewarm)
        out["resume_args"] = list(self.resume_args)
        # asdict gives one key per field, as RunConfigRecord says (a test keeps them alike).
        return cast(RunConfigRecord, out)

    @classmethod
    # open-ended: config.json as read, before its keys are checked against the fields
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        """Build from a dict, rejecting unknown keys (listing the valid ones)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise UsageError(f"run config: unknown key(s) {unknown}; valid: {sorted(known)}")
        return cls(**{**raw, "command": tuple(raw["command"])})


class EnvDefaults(TypedDict, total=False):
    """The RunConfig options the environment may set (each only when its variable is)."""

    spares: int
    hang_floor_s: float
    local_every: int
    max_restarts: int


def env_defaults(environ: dict[str, str] | None = None) -> EnvDefaults:
    """Defaults from the environment (the SPANK plugin exports these for `launch`):
    ``SLURM_ROBUST_SPARES``, ``SLURM_ROBUST_HANG_TIMEOUT`` (the hang floor, seconds),
    ``SLURM_ROBUST_CKPT_EVERY`` (the node-local disk tier's cadence; memory and peer
    copies are taken every step anyway) and ``SLURM_ROBUST_MAX_RESTARTS``.

    Raises UsageError naming the variable when a value is not a plain whole number.
    """
    env = os.environ if environ is None else environ

    def whole(var: str) -> str | None:
        text = env.get(var)
        # The SPANK plugin's rule (spank/README.md): plain decimal digits, no sign, no
        # unit; a user can export these by hand, so they are checked again here.
        if text is not None and not _DECIMAL.match(text):
            raise UsageError(f"{var}={text!r} is not a whole number (digits only)")
        return text

    out: EnvDefaults = {}
    # One variable at a time, in this order: the first bad one is the one named.
    if (text := whole(SPARES_ENV)) is not None:
        out["spares"] = int(text)
    if (text := whole(HANG_TIMEOUT_ENV)) is not None:
        out["hang_floor_s"] = float(text)
    if (text := whole(CKPT_EVERY_ENV)) is not None:
        out["local_every"] = int(text)
    if (text := whole(MAX_RESTARTS_ENV)) is not None:
        out["max_restarts"] = int(text)
    if out.get("hang_floor_s") == 0:
        raise UsageError(f"{HANG_TIMEOUT_ENV}=0: use at least 1 second")
    return out
