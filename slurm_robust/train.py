"""The training-side API: rank layout, restore at start, a snapshot at every step's end.

Usage (see examples/train_gpt.py)::

    from slurm_robust import train

    run = train.init()                          # torch.distributed from the env, rank layout
    start = run.restore(model, optimizer)       # steps already done (0 on a fresh start)
    for step in range(start, total_steps):
        if run.should_skip(step + 1):           # the user's NaN policy dropped this batch
            run.step_end(step + 1, None, None, model, optimizer, data_position=step + 1)
            continue
        with run.busy():                        # optional: this rank's own compute
            loss = compute_loss(batch(step)); loss.backward()
        run.local_check(step + 1, loss, model.parameters(), data_position=step)
        average_gradients()
        run.before_update()                     # the previous snapshot's copy is done
        optimizer.step()
        run.step_end(step + 1, loss.item(), grad_norm, model, optimizer, data_position=step + 1)
    run.finish(params_sha256=digest(model))

Under the robust launcher (``SLURM_ROBUST_PROGRESS`` is set) ``step_end``:

- checks the loss and grad norm: a non-finite value, or one above ``spike_factor`` x the
  recent median, ends the worker with exit code 87 (nan) or 88 (loss_spike) *without*
  snapshotting that state, so the restart restores the last good step;
- hands the state to ``slurm_robust.ckpt`` (memory tier every step, peer backup, disk
  tiers) and appends one line to the progress channel (a node-local file the agent reads;
  a few microseconds, never blocks on the agent).

Fail-slow detection needs each rank's *busy* time, not its step-end time: with a
synchronous gradient collective every rank ends the step together (the fast ones wait
inside the collective). ``with run.busy():`` around the rank's own work (data, forward,
backward; not the collective, not idle waits) measures it; the step's progress line then
carries ``busy_s``, the time spent inside such blocks since the previous ``step_end``.
It is optional: a script that never uses it gets no fail-slow detection, nothing else
changes.

A plain torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, no
launcher) works too: ``restore`` returns 0 and ``step_end`` only checks values; the
script then keeps its own checkpoints. ``finish(events_path=...)`` writes a ``run_end``
event itself in that case.

``with run.section(name):`` (optional) around slow work between steps: hang detection
then gives it its own limit, learned from its durations, instead of calling a
one-minute evaluation a hang of half-second steps (launcher/control/phases.py). Names
``eval`` and ``save`` are the evaluation and checkpoint-save phases; any other name is a
section with its own limit. A run that declares no section keeps the single hang rule.

``local_check`` (optional, before the gradient collective) looks at this rank's own loss
and grad norm, so a NaN incident names the rank where the value first appeared, not the
first rank to report it (launcher/node/nan_local.py); without it the origin is unknown
and the incident blames no node. ``should_skip(step)`` is true for a batch the user's
``--nan-policy skip`` dropped after a NaN came back on replay.

Fault injection (``slurm-robust inject nan``) sends SIGUSR1: the handler installed by
``init`` poisons one parameter with NaN right after the next snapshot's copy finished,
so the following step really produces a non-finite loss. ``inject nan --mode data`` and
``inject sdc`` write ``<run_dir>/nan/poison.json``/``sdc.json`` first; the same signal
then makes the worker reload them (``local_check`` corrupts the gradients they name).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

# DDP users: wrap_ddp, not DistributedDataParallel, for bit-identical restarts.
from slurm_robust.ddp import wrap_ddp  # noqa: F401  (re-exported)
from slurm_robust.launcher import rank_map
from slurm_robust.launcher.classify import EXIT_NONFINITE, EXIT_SPIKE
from slurm_robust.launcher.control.events import EventLog
from slurm_robust.launcher.control.policy import WINDOW, step_anomaly
from slurm_robust.launcher.enums import WorkPhase
from slurm_robust.launcher.messages import SECTION_NAME_MAX
from slurm_robust.launcher.worker_signals import DRAIN_FLUSH_S, DRAIN_SIGNAL
from slurm_robust.stacks.handler import DEFAULT_TEMPLATE, install_stack_dump_handler

POISON_SIGNAL = signal.SIGUSR1
#: Where registered Stateful objects' states travel inside a snapshot's extras.
STATEFUL_KEY = "__stateful__"
#: The spike test's recent values, kept in each snapshot: a restored worker tests the
#: steps it replays against the same baseline (without it the test was blind for
#: SPIKE_MIN_HISTORY steps after every restart, so a spike the data causes came back
#: a few steps later as a "new" incident, again and again).
SENTINEL_KEY = "__sentinel__"
#: Section names that are the built-in phases (their --hang-limit keys); any other name
#: is a user section.
NAMED_PHASES = {WorkPhase.EVAL.value: WorkPhase.EVAL, WorkPhase.SAVE.value: WorkPhase.SAVE}


@dataclass
class RobustRun:
    """One rank's view of the run (returned by :func:`init`)."""

    rank: int
    local_rank: int
    world_size: int
    node: str
    attempt: int
    job_id: str
    run_dir: str | None
    backend: str
    spike_factor: float = 5.0
    restored_step: int | None = None
    restore_tier: str | None = None
    last_step: int | None = None
    _mgr: Any = None
    _progress_fd: int | None = None
    _losses: list[float] = field(default_factory=list)
    _norms: list[float] = field(default_factory=list)
    _poison: bool = False
    _busy_s: float | None = None
    #: After restore(): the snapshot's data position and extras, whatever their type
    #: (None and {} on a fresh start).
    data_position: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    _stateful: dict[str, Any] = field(default_factory=dict)
    #: This rank's last local_check: {"step", "local", ...} (NaN origin).
    _local: dict[str, Any] | None = None
    _rehearsal: Any = None
    #: The open sections, innermost last: leaving one reports the one around it.
    _phases: list[tuple[WorkPhase, str | None]] = field(default_factory=list)
    #: Steps whose batch the NaN policy ``skip`` dropped (read at init).
    skip_steps: frozenset[int] = frozenset()
    #: A dual-phase replay's worker (``SLURM_ROBUST_REPLAY``): its group is
    #: the whole world it sees; it restores its own snapshot as ``global_rank``,
    #: snapshots nothing and ends at the replay's last step.
    replay: Any = None
    global_rank: int | None = None

    @property
    def robust(self) -> bool:
        """Whether a robust agent supervises this worker."""
        return self._progress_fd is not None

    # ----------------------------------------------------------------- state
    def register_stateful(self, name: str, obj: Any) -> None:
        """Snapshot ``obj`` with every step and restore it with :meth:`restore`.

        ``obj`` is Stateful as torch.distributed.checkpoint defines it: it has
        ``state_dict()`` and ``load_state_dict(state)`` (a stateful data loader or
        sampler, a metric, a prefetch queue's cursor). Register before ``restore``.
        """
        if not (callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(f"{name!r}: {type(obj).__name__} has no state_dict() and "
                            "load_state_dict(); wrap it or pass its state as extras")
        self._stateful[name] = obj

    # ----------------------------------------------------------------- restore
    def restore(self, model: Any, optimizer: Any = None, scheduler: Any = None) -> int:
        """Restore the newest common snapshot (collective); returns the steps done.

        Returns 0 on a fresh start or without the launcher. The snapshot's
        ``data_position`` is returned when it is an int (the example's step counter),
        else the restored step; the position itself, of any type, is in
        ``run.data_position`` and the ``extras`` of ``step_end`` in ``run.extras``;
        registered Stateful objects are loaded.
        """
        self.data_position, self.extras = None, {}
        if not self.robust:
            return 0
        from slurm_robust import ckpt  # lazy: torch, only in a robust worker

        if self.replay is not None:
            return self._restore_for_replay(model, optimizer, scheduler)

        cfg = ckpt.CheckpointConfig.from_env(peer_backup=self.world_size > 1)
        rank_nodes = rank_nodes_from_env()
        # job_key: the job id plus a keyed hash of the run secret (the agent derives
        # it), so the private checkpoint directories cannot be pre-created by others.
        self._mgr = ckpt.CheckpointManager(cfg, self.rank, self.world_size, self.node,
                                           cfg.job_key or self.job_id,
                                           rank_nodes=rank_nodes)
        res = self._mgr.restore()
        return self._apply_restored(res.step, res.state, res.tiers.get(self.rank),
                                    res.seconds, model, optimizer, scheduler)

    def _apply_restored(self, step: int | None, state: Any, tier: str | None,
                        seconds: float, model: Any, optimizer: Any, scheduler: Any) -> int:
        """Load a restored snapshot (``step`` None: a fresh start) into the model, the
        optimizer, the scheduler and the registered Stateful objects; report it; return
        the steps done (the data position when it is an int)."""
        from slurm_robust import ckpt

        position: Any = 0
        if step is not None:
            position = ckpt.apply_state(state, model, optimizer, scheduler)
            self.restore_tier = tier
            self.data_position = position
            extras = dict(state.get("extras") or {})
            saved = extras.pop(STATEFUL_KEY, None) or {}
            for name, obj in self._stateful.items():
                if name in saved:
                    obj.load_state_dict(saved[name])
            sentinel = extras.pop(SENTINEL_KEY, None) or {}
            self._losses = _finite_floats(sentinel.get("loss"))
            self._norms = _finite_floats(sentinel.get("grad_norm"))
            self.extras = extras
        self.restored_step = step
        self._report({"kind": "restored", "step": step, "tier": self.restore_tier,
                      "seconds": round(seconds, 4)})
        if isinstance(position, int):
            return position
        return step or 0

    def _restore_for_replay(self, model: Any, optimizer: Any, scheduler: Any) -> int:
        """A replay's restore: this rank's own copy of the controller's step, no
        collective (the group is not the world the snapshot was taken in)."""
        from slurm_robust import ckpt
        from slurm_robust.ckpt.config import CkptPaths, job_dir_name
        from slurm_robust.ckpt.layout import ParallelLayout
        from slurm_robust.ckpt.restore import restore_own

        spec, t0 = self.replay, time.monotonic()
        if spec.restore_step is None:
            return self._apply_restored(None, None, None, 0.0, model, optimizer, scheduler)
        cfg = ckpt.CheckpointConfig.from_env(peer_backup=False)
        paths = CkptPaths(cfg, job_dir_name(cfg, self.job_id), self.node, self.global_rank)
        res = restore_own(paths, spec.global_world,
                          ParallelLayout.data_parallel(spec.global_world).as_dict(),
                          cfg.peer_slots, spec.restore_step)
        return self._apply_restored(res.step, res.state, res.tiers.get(self.global_rank),
                                    time.monotonic() - t0, model, optimizer, scheduler)

    # ----------------------------------------------------------------- per step
    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Time this rank's own work (wrap data, forward and backward; keep the
        gradient collective and any idle wait outside): the step's ``busy_s``, the
        input of fail-slow detection, is the time spent in these blocks since the
        previous ``step_end``. Two clock reads per block.
        """
        start = time.monotonic()
        try:
            yield
        finally:
            self._busy_s = (self._busy_s or 0.0) + time.monotonic() - start

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Slow work between steps (see the module docstring): ``eval``, ``save``, or
        a name of the script's own (1 to 64 characters). Sections nest."""
        if not isinstance(name, str) or not 0 < len(name) <= SECTION_NAME_MAX:
            raise ValueError(f"run.section({name!r}): use a name of 1 to "
                             f"{SECTION_NAME_MAX} characters, e.g. 'eval'")
        self.enter_phase(NAMED_PHASES.get(name, WorkPhase.SECTION), name)
        try:
            yield
        finally:
            self.leave_phase()

    def enter_phase(self, phase: WorkPhase, name: str | None = None) -> None:
        """Report that this rank entered ``phase`` (the framework callbacks' form of
        :meth:`section`); :meth:`leave_phase` returns to the one before."""
        self._phases.append((phase, name if phase is WorkPhase.SECTION else None))
        self._report_phase()

    def leave_phase(self) -> None:
        """Leave the innermost phase entered (nothing open: nothing to do)."""
        if self._phases:
            self._phases.pop()
            self._report_phase()

    @property
    def current_phase(self) -> WorkPhase:
        return self._phases[-1][0] if self._phases else WorkPhase.STEPS

    def _report_phase(self) -> None:
        phase, name = self._phases[-1] if self._phases else (WorkPhase.STEPS, None)
        item: dict[str, Any] = {"kind": "phase", "phase": phase.value, "step": self.last_step,
                                "t": time.time()}
        if name is not None:
            item["section"] = name
        self._report(item)

    def should_skip(self, step: int) -> bool:
        """Whether the launcher asked to skip the batch of ``step`` (numbered as in
        ``step_end``): a NaN that came back on replay under ``--nan-policy skip``."""
        return step in self.skip_steps

    def local_check(self, step: int, loss: Any, params: Any,
                    data_position: Any = None) -> None:
        """Before the gradient collective: note whether this rank's own loss or local
        grad norm is non-finite (the NaN's origin). ``step`` is numbered as in
        ``step_end``; ``data_position`` (the batch's position) goes into the anomaly."""
        from slurm_robust.launcher.node import nan_local

        params = list(params)
        fault = self._rehearsal.corrupts(step, self.attempt, self.replay is not None) \
            if self._rehearsal else None
        if fault is not None:
            nan_local.corrupt_gradients(params)
            print(f"slurm_robust: rehearsal {fault}: corrupted rank {self.rank}'s gradients "
                  f"at step {step}", file=sys.stderr, flush=True)
        if hasattr(loss, "detach"):
            loss = loss.detach()
        value = None if loss is None else float(loss)
        norm = nan_local.local_grad_norm(params)
        name = nan_local.non_finite(value, norm)
        self._local = {"step": step, "local": name is not None, "local_name": name,
                       "local_loss": str(value), "local_grad_norm": str(norm),
                       "data_position": data_position}

    def before_update(self) -> None:
        """Call before the optimizer step: waits until the last snapshot's copy has
        read the state (the only point where training waits for the checkpoint)."""
        if self._mgr is not None:
            self._mgr.wait()

    def step_end(self, step: int, loss: float | None, grad_norm: float | None = None,
                 model: Any = None, optimizer: Any = None, scheduler: Any = None,
                 data_position: Any = None, extras: dict[str, Any] | None = None) -> None:
        """Report the end of ``step`` (steps done so far) and snapshot the state.

        ``data_position`` (any picklable value) and ``extras`` (a dict of picklable
        values or tensors) come back from ``restore`` as ``run.data_position`` and
        ``run.extras``; registered Stateful objects are captured too.
        """
        for name, value, history in (("loss", loss, self._losses),
                                     ("grad_norm", grad_norm, self._norms)):
            anomaly = step_anomaly(history, value, self.spike_factor)
            if anomaly is not None:
                self._abort(anomaly, name, step, value)
            if value is not None:
                history.append(float(value))
                del history[:-64]
        local = self._local if self._local and self._local["step"] == step else None
        if local is not None and local["local"]:
            # Non-finite here although the reported values are finite (a script that
            # masks them): still a NaN, and this rank is its origin.
            self._abort("nan", str(local["local_name"]), step, None)
        if self._mgr is not None and model is not None:
            from slurm_robust import ckpt  # lazy: torch, only in a robust worker

            # Copies: the snapshot is taken in the background, and a loader's state or
            # the caller's extras may change before it is.
            saved = copy.deepcopy(dict(extras or {}))
            saved[SENTINEL_KEY] = {"loss": self._losses[-WINDOW:],
                                   "grad_norm": self._norms[-WINDOW:]}
            if self._stateful:
                saved[STATEFUL_KEY] = copy.deepcopy({name: obj.state_dict() for name, obj
                                                     in self._stateful.items()})
            self._mgr.snapshot(step, ckpt.capture_state(model, optimizer, scheduler,
                                                        data_position=copy.deepcopy(
                                                            data_position), extras=saved))
        self.last_step = step
        item = {"kind": "step", "step": step, "loss": loss, "grad_norm": grad_norm,
                "t": time.time()}
        if self._busy_s is not None:
            item["busy_s"] = round(self._busy_s, 6)
            self._busy_s = None
        self._report(item)
        if self._poison and model is not None:
            self._apply_poison(model)
        if self.replay is not None and step >= self.replay.until_step:
            self._end_replay(step)

    def _end_replay(self, step: int) -> None:
        """The replay's window is done without a NaN: meet the group, exit 0 (the
        script's own loop must not go on: this group is not the run)."""
        import torch.distributed as dist

        self._report({"kind": "final", "step": step, "params_sha256": None,
                      "t": time.time()})
        if dist.is_initialized():
            try:
                dist.barrier()  # the group's store lives in its rank 0's process
            except RuntimeError:
                pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def finish(self, params_sha256: str | None = None, events_path: str | None = None,
               destroy_process_group: bool = True) -> None:
        """End of training: flush the checkpoint pipeline, report the final digest, and
        end the process group (unless a framework that owns it says not to)."""
        # Said first: the flush below can take longer than a step, and a silent rank
        # past its last step looked hung to the controller.
        self._report({"kind": "finishing", "step": self.last_step, "t": time.time()})
        if self._mgr is not None:
            self._mgr.close()
            self._mgr = None
        step = self.last_step
        self._report({"kind": "final", "step": step, "params_sha256": params_sha256,
                      "t": time.time()})
        if not self.robust and events_path and self.rank == 0:
            _standalone_run_end(events_path, self.job_id, params_sha256, step)
        import torch.distributed as dist

        if destroy_process_group and dist.is_initialized():
            # Every rank finished its last collective; meet once more so rank 0, which
            # hosts the rendezvous store, does not leave while others still tear down
            # (a rank then aborted at exit: "terminate called without an active
            # exception", seen in the DDP example's standalone run).
            try:
                dist.barrier()
            except RuntimeError:
                pass  # a peer is gone already: nothing left to wait for
            dist.destroy_process_group()

    # ----------------------------------------------------------------- internals
    def _report(self, item: dict[str, Any]) -> None:
        if self._progress_fd is None:
            return
        # NaN and Infinity are written as JSON's common extension; the agent's reader
        # (json.loads) accepts them, and they are evidence worth keeping.
        line = json.dumps(item, separators=(",", ":"), default=str) + "\n"
        os.write(self._progress_fd, line.encode())

    def _abort(self, anomaly: str, name: str, step: int, value: float | None) -> None:
        msg = f"slurm_robust: {anomaly}: {name} is {value} at step {step}"
        print(msg, file=sys.stderr, flush=True)
        item = {"kind": "anomaly", "what": anomaly, "name": name, "step": step,
                "value": str(value)}
        local = self._local
        if local is not None and local["step"] == step:
            # Origin evidence: whether this rank had it before the collective.
            item.update({k: v for k, v in local.items() if k != "step"})
        self._report(item)
        if self._mgr is not None:
            # Let the snapshots already taken complete, so the restart finds them.
            self._mgr.flush(timeout=30.0)
        os._exit(EXIT_NONFINITE if anomaly == "nan" else EXIT_SPIKE)

    def _apply_poison(self, model: Any) -> None:
        import torch

        from slurm_robust.launcher.node import nan_local

        self._poison = False
        rehearsal = nan_local.load_rehearsal(self.run_dir, self.rank, self.node)
        if rehearsal.ids != getattr(self._rehearsal, "ids", ()):
            # `inject nan --mode data` / `inject sdc` wrote its file before signalling:
            # local_check applies it; the parameters stay clean.
            self._rehearsal = rehearsal
            print(f"slurm_robust: rehearsal faults now {rehearsal}", file=sys.stderr,
                  flush=True)
            return
        if self._mgr is not None:
            self._mgr.wait()  # the snapshot just taken must not read the poison
        with torch.no_grad():
            next(iter(model.parameters())).fill_(float("nan"))
        print("slurm_robust: injected NaN into the first parameter", file=sys.stderr,
              flush=True)


def init(backend: str | None = None, timeout_s: float = 1800.0) -> RobustRun:
    """Initialise torch.distributed from the torchrun-style environment.

    Uses NCCL when CUDA is available, else gloo (unless ``backend`` says otherwise);
    a world of one skips the process group. Installs the faulthandler stack-dump
    handler (for hang captures where ptrace is refused) and the NaN-injection handler.
    """
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if world > 1 and not dist.is_initialized():
        from slurm_robust.store_wait import wait_for_store

        wait_for_store(timeout_s=min(timeout_s, 60.0))
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
    run = RobustRun(rank=rank, local_rank=local_rank, world_size=world,
                    node=os.environ.get("SLURM_ROBUST_NODE")
                    or os.environ.get("SLURMD_NODENAME") or "local",
                    attempt=int(os.environ.get("SLURM_ROBUST_ATTEMPT")
                                or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
                    job_id=os.environ.get("SLURM_ROBUST_JOB_ID")
                    or os.environ.get("SLURM_JOB_ID") or "local",
                    run_dir=os.environ.get("SLURM_ROBUST_RUN_DIR"), backend=backend)
    progress = os.environ.get("SLURM_ROBUST_PROGRESS")
    if progress:
        run._progress_fd = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    replay_env = os.environ.get("SLURM_ROBUST_REPLAY")
    if replay_env and progress:
        from slurm_robust.launcher.control.replay import ReplaySpec

        run.replay = ReplaySpec.from_env(replay_env)
        run.global_rank = run.replay.global_rank(local_rank)
    if run.run_dir:
        install_stack_dump_handler(os.path.join(run.run_dir, DEFAULT_TEMPLATE))
        from slurm_robust.launcher.node import nan_local

        run.skip_steps = nan_local.skipped_steps(run.run_dir)
        run._rehearsal = nan_local.load_rehearsal(run.run_dir, rank, run.node)
        request = nan_local.bitwise_request(run.run_dir, run.attempt)
        if request is not None and run.replay is None:
            # Every rank of this attempt runs it now, at once: the controller
            # compares the digests bit for bit and evicts a node that differs.
            from slurm_robust.launcher.node.reference_step import reference_digest

            t0 = time.monotonic()
            digest = reference_digest(f"cuda:{local_rank}" if backend == "nccl" else "cpu",
                                      corrupt=run._rehearsal.sdc_bitwise)
            run._report({"kind": "bitwise", "id": request, "digest": digest,
                         "seconds": round(time.monotonic() - t0, 4), "t": time.time()})

    def _poison(signum: int, frame: Any) -> None:
        run._poison = True

    signal.signal(POISON_SIGNAL, _poison)
    if progress:
        signal.signal(DRAIN_SIGNAL, lambda signum, frame: _drain(run))
    previous_hook = sys.excepthook

    def _flush_then_report(*exc_info: Any) -> None:
        # An uncaught exception ends the worker: let the snapshots already taken
        # complete first, so the restart loses no finished step.
        if run._mgr is not None:
            try:
                run._mgr.flush(timeout=10.0)
            except Exception:  # noqa: BLE001 - the original error is the one to show
                pass
        previous_hook(*exc_info)

    sys.excepthook = _flush_then_report
    return run


def _drain(run: RobustRun) -> None:
    """The agent ends this generation by choice (worker_signals.py): let the snapshots
    already taken reach their tiers, then end as SIGTERM would."""
    if run._mgr is not None:
        try:
            run._mgr.flush(timeout=DRAIN_FLUSH_S)
        except Exception:  # noqa: BLE001 - ending is the point; the restart sees what is whole
            pass
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def rank_nodes_from_env() -> list[str] | None:
    """The node of every rank, from SLURM_ROBUST_RANK_NODES (compact runs, see
    slurm_robust.launcher.rank_map); None outside the launcher. A malformed value is
    the launcher's bug, reported as such rather than guessed around."""
    raw = os.environ.get("SLURM_ROBUST_RANK_NODES")
    if not raw:
        return None
    try:
        runs = json.loads(raw)
        return None if runs is None else rank_map.decode(runs)
    except ValueError as exc:
        raise RuntimeError(f"SLURM_ROBUST_RANK_NODES cannot be read ({exc}); it is set by "
                           "the slurm_robust launcher, which this worker's must match") from exc


def _finite_floats(values: Any) -> list[float]:
    """The snapshot's sentinel values as floats (anything else dropped, never raised)."""
    if not isinstance(values, list):
        return []
    return [float(v) for v in values[-WINDOW:]
            if isinstance(v, int | float) and math.isfinite(float(v))]


def params_digest(model: Any) -> str:
    """SHA-256 over the model's parameters and buffers, by name in sorted order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _standalone_run_end(path: str, job_id: str, sha: str | None, step: Any) -> None:
    EventLog(path, run_id=f"standalone-{job_id}", job_id=None).run_end(
        "completed", step if isinstance(step, int) else None, sha, None)
