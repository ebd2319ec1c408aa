"""CheckpointManager: the per-rank object training code talks to (see the package doc)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from slurm_robust.ckpt import restore as restore_mod
from slurm_robust.ckpt.blob import (
    FORMAT,
    checksum,
    encode_meta,
    encode_skeleton,
    flatten,
    pack_layout,
    read_meta,
    write_file_atomic,
)
from slurm_robust.ckpt.config import (
    OWN_SLOTS,
    OWN_SLOTS_WITH_PEER,
    CheckpointConfig,
    CkptPaths,
    job_dir_name,
)
from slurm_robust.ckpt.errors import CheckpointError, PeerBackupError
from slurm_robust.ckpt.layout import ParallelLayout, backup_sources, pick_peers
from slurm_robust.ckpt.plan import RestoreResult
from slurm_robust.ckpt.slots import SlotBuffer, dtype_name, tensor_views
from slurm_robust.ckpt.tiers import prune_durable, prune_local, write_disk_copy
from slurm_robust.ckpt.transport import Outgoing, Transport

log = logging.getLogger("slurm_robust.ckpt")


@dataclass
class CheckpointStats:
    """Cumulative timings (seconds) and sizes; ``blocking_s`` is what training waited."""

    snapshots: int = 0
    blocking_s: float = 0.0
    slot_wait_s: float = 0.0
    peer_wait_s: float = 0.0  # a snapshot waiting for the previous one's peer exchange
    copy_s: float = 0.0
    checksum_s: float = 0.0
    peer_s: float = 0.0
    disk_s: float = 0.0
    state_bytes: int = 0
    peer_sends: int = 0
    disk_writes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Job:
    step: int
    slot: int
    pairs: list[tuple[torch.Tensor, torch.Tensor]]  # (destination view, live tensor)
    event: Any  # torch.cuda.Event for an async device copy, else None
    header: dict[str, Any]
    skeleton: bytes


class CheckpointManager:
    """Per-step snapshots of one rank, with peer backup and disk tiers.

    Args:
        config: where and how often each tier is written.
        rank, world_size: this rank and the number of ranks (over ``group``).
        node: the node name (part of every memory and local-disk path).
        job_id: the job id (part of every path).
        layout: TP/PP/DP sizes (default: pure data parallel); picks the backup peer.
        group: the process group spanning all ranks (default: the world).
        rank_nodes: node of every rank; gathered over ``group`` when not given.

    Construction is collective when world_size > 1 (it creates private gloo groups).

    Raises:
        CheckpointError: torch.distributed is not initialised for a multi-rank run.
        PeerBackupError: peer_backup is on but all ranks share one node.
    """

    def __init__(self, config: CheckpointConfig, rank: int, world_size: int, node: str,
                 job_id: str, layout: ParallelLayout | None = None,
                 group: dist.ProcessGroup | None = None,
                 rank_nodes: list[str] | None = None) -> None:
        self.config = config
        self.rank, self.world_size = rank, world_size
        self.layout = layout or ParallelLayout.data_parallel(world_size)
        if self.layout.world_size != world_size:
            raise CheckpointError(f"layout {self.layout.as_dict()} does not have "
                                  f"{world_size} ranks")
        self.paths = CkptPaths(config, job_dir_name(config, str(job_id)), node, rank)
        self.stats = CheckpointStats()
        self.peer: int | None = None
        self.source: int | None = None
        self._ctl: dist.ProcessGroup | None = None
        self._transport: Transport | None = None
        self._global = list(range(world_size))
        self.rank_nodes = [node]
        if world_size > 1:
            self._init_groups(group, node, rank_nodes)
        self._n_slots = OWN_SLOTS_WITH_PEER if self._transport is not None else OWN_SLOTS
        self._slots: list[SlotBuffer | None] = [None] * self._n_slots
        self._backups: list[SlotBuffer | None] = [None] * config.peer_slots
        self._signature: list[tuple[str, tuple[int, ...], int]] | None = None
        self._specs_json: list[list[Any]] = []
        self._next_slot = 0
        self._next_backup = 0
        self._busy = [0] * self._n_slots
        #: The step of the newest snapshot started, and the newest whose peer exchange
        #: finished (None: none yet): a snapshot waits until the one before it is backed up.
        self._last_step: int | None = None
        self._peer_done: int | None = None
        self._cv = threading.Condition()
        self._copied = threading.Event()
        self._copied.set()
        self._pending_event: Any = None
        self._side_stream: Any = None
        self._error: BaseException | None = None
        self._closed = False
        self._queues: dict[str, queue.Queue[Any]] = {}
        self._threads: list[threading.Thread] = []
        for name, fn in (("copy", self._copy_job), ("peer", self._peer_job),
                         ("disk", self._disk_job)):
            q: queue.Queue[Any] = queue.Queue()
            t = threading.Thread(target=self._worker, args=(q, fn), daemon=True,
                                 name=f"ckpt-{name}-r{rank}")
            self._queues[name] = q
            self._threads.append(t)
            t.start()

    # ----------------------------------------------------------------- setup

    def _init_groups(self, group: dist.ProcessGroup | None, node: str,
                     rank_nodes: list[str] | None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise CheckpointError(f"world_size is {self.world_size} but torch.distributed "
                                  "is not initialised; call init_process_group first")
        group = group or dist.group.WORLD
        if dist.get_world_size(group) != self.world_size:
            raise CheckpointError(f"group has {dist.get_world_size(group)} ranks, "
                                  f"expected {self.world_size}")
        self._global = [dist.get_global_rank(group, r) for r in range(self.world_size)]
        timeout = timedelta(seconds=self.config.peer_timeout_s)
        self._ctl = dist.new_group(self._global, backend="gloo", timeout=timeout)
        if rank_nodes is None:
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, node, group=self._ctl)
            rank_nodes = [str(n) for n in gathered]
        self.rank_nodes = list(rank_nodes)
        if not self.config.peer_backup:
            return
        peers = pick_peers(self.layout, self.rank_nodes)
        self.peer = peers[self.rank]
        self.source = backup_sources(peers)[self.rank]
        backend, device = "gloo", None
        if torch.cuda.is_available() and dist.is_nccl_available():
            backend, device = "nccl", torch.device("cuda", torch.cuda.current_device())
        peer_group = dist.new_group(self._global, backend=backend, timeout=timeout)
        self._transport = Transport(peer_group, self.config.chunk_bytes, device)
        log.info("rank %d backs up to rank %d (node %s) over %s", self.rank, self.peer,
                 self.rank_nodes[self.peer], backend)

    # ------------------------------------------------------------ snapshots

    def snapshot(self, step: int, state: dict[str, Any]) -> None:
        """Start a snapshot of ``state`` taken after ``step``; returns without copying.

        Call ``wait()`` before anything mutates the state's tensors. Blocks only while
        the previous snapshot's peer exchange has not finished (so no survivor of a lost
        node runs ahead of what the lost rank's holder received, see
        ``OWN_SLOTS_WITH_PEER``), or while the buffer it needs still serves an older
        snapshot's disk write.
        """
        t0 = time.perf_counter()
        self._check_open()
        self._wait_copy()
        skeleton, tensors = flatten(state, torch.Tensor)
        try:
            skel_bytes = encode_skeleton(skeleton)
        except ValueError as exc:
            raise CheckpointError(f"cannot snapshot step {step}: {exc}") from exc
        self._ensure_slots(tensors)
        self._wait_previous_backup()
        k = self._next_slot
        self._acquire_slot(k)
        slot = self._slots[k]
        if slot is None:
            raise CheckpointError("snapshot buffers were released (manager closed)")
        slot.invalidate()
        header = {"format": FORMAT, "step": int(step), "rank": self.rank,
                  "world_size": self.world_size, "layout": self.layout.as_dict(),
                  "node": self.paths.node, "job_id": self.paths.job_id,
                  "nbytes": slot.nbytes, "checksum_algo": self.config.checksum,
                  "tensors": self._specs_json, "time": time.time()}
        views = tensor_views(slot.flat, self._spec_objs)
        pairs = list(zip(views, tensors, strict=True))
        event = self._start_device_copy(pairs) if any(t.is_cuda for t in tensors) else None
        job = _Job(int(step), k, pairs if event is None else [], event, header, skel_bytes)
        self._copied.clear()
        self._pending_event = event
        self._queues["copy"].put(job)
        self._next_slot = (k + 1) % self._n_slots
        self._last_step = int(step)
        self.stats.snapshots += 1
        self.stats.blocking_s += time.perf_counter() - t0

    def wait(self) -> None:
        """Return when the last snapshot has read every live tensor.

        On GPU this only orders the current CUDA stream after the copy (no host wait).
        """
        t0 = time.perf_counter()
        self._wait_copy()
        self.stats.blocking_s += time.perf_counter() - t0

    def _wait_copy(self) -> None:
        if self._pending_event is not None:
            torch.cuda.current_stream().wait_event(self._pending_event)
            self._pending_event = None
        else:
            self._copied.wait()
        self._raise_background_error()

    def flush(self, timeout: float | None = None) -> None:
        """Block until every started snapshot has reached all of its tiers."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while any(self._busy):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise CheckpointError(f"checkpoint pipeline still busy after {timeout} s "
                                          f"(slots busy: {self._busy})")
                self._cv.wait(left)
        self._raise_background_error()

    def restore(self) -> RestoreResult:
        """Agree on the newest step valid for every rank and load this rank's copy.

        Collective. See the package docstring; raises NoValidCheckpointError when
        copies exist but no step is complete for every rank, unless the missing ranks'
        copies can only have been volatile ones lost with their nodes (a fresh start).
        """
        self._check_open()
        self.flush()
        return restore_mod.restore(self.paths, self.world_size, self.layout.as_dict(),
                                   self.config.peer_slots, self._ctl, self._transport,
                                   self._global, durable_every=self.config.durable_every)

    def host_bytes(self) -> int:
        """Host memory held for checkpoints: own slots plus backup buffers."""
        return sum(b.nbytes for b in [*self._slots, *self._backups] if b is not None)

    def close(self, timeout: float | None = 600.0) -> None:
        """Flush, stop the background threads and unmap buffers; files stay (the tiers)."""
        if self._closed:
            return
        try:
            if self._error is None:
                self.flush(timeout)
        finally:
            self._closed = True
            for q in self._queues.values():
                q.put(None)
            for t in self._threads:
                t.join(timeout=5.0)
            for buf in [*self._slots, *self._backups]:
                if buf is not None:
                    buf.release()
            self._slots = [None] * self._n_slots
            self._backups = [None] * self.config.peer_slots

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("CheckpointManager is closed")
        self._raise_background_error()

    def _raise_background_error(self) -> None:
        if self._error is not None:
            err = self._error
            kind = PeerBackupError if isinstance(err, dist.DistBackendError) else CheckpointError
            raise kind(f"checkpoint pipeline of rank {self.rank} failed: {err!r}") from err

    def _ensure_slots(self, tensors: list[torch.Tensor]) -> None:
        sig = [(dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size())
               for t in tensors]
        if sig == self._signature:
            return
        if self._signature is not None:
            log.warning("rank %d: the state's tensors changed shape; reallocating the "
                        "snapshot buffers (once is expected, every step is not)", self.rank)
            self.flush()
        specs, nbytes = pack_layout(sig)
        self._spec_objs = specs
        self._specs_json = [[s.dtype, list(s.shape), s.offset, s.nbytes] for s in specs]
        self.stats.state_bytes = nbytes
        pin = self.config.pin_memory and any(t.is_cuda for t in tensors)
        for k in range(self._n_slots):
            old = self._slots[k]
            if old is not None:
                old.release()
            self._slots[k] = SlotBuffer(self.paths.slot(k), nbytes, pin=pin,
                                        shared_root=self.paths.memory_shared)
        self._signature = sig
        self._prefer_older_slot()

    def _prefer_older_slot(self) -> None:
        # Write first into the slot holding the older (or no) complete snapshot, so the
        # newest memory copy survives a crash during the first snapshot.
        steps = []
        for k in range(self._n_slots):
            try:
                steps.append(read_meta(self.paths.slot(k))[0]["step"])
            except Exception:  # absent or damaged: the best slot to overwrite
                steps.append(-1)
        self._next_slot = min(range(self._n_slots), key=lambda k: (steps[k], k))

    def _acquire_slot(self, k: int) -> None:
        t0 = time.perf_counter()
        with self._cv:
            while self._busy[k] and self._error is None:
                self._cv.wait(1.0)
            self._busy[k] += 1
        self.stats.slot_wait_s += time.perf_counter() - t0

    def _wait_previous_backup(self) -> None:
        """Block until the previous snapshot's peer exchange finished (OWN_SLOTS_WITH_PEER
        says why); at once without a peer, before the first snapshot, or on an error."""
        if self._transport is None or self._last_step is None:
            return
        t0 = time.perf_counter()
        with self._cv:
            while self._error is None and (self._peer_done is None
                                           or self._peer_done < self._last_step):
                self._cv.wait(1.0)
        self.stats.peer_wait_s += time.perf_counter() - t0
        self._raise_background_error()

    def _release_slot(self, k: int) -> None:
        with self._cv:
            self._busy[k] -= 1
            self._cv.notify_all()

    def _start_device_copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        device = next(t.device for _v, t in pairs if t.is_cuda)
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=device)
        stream = self._side_stream
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for view, src in pairs:
                if src.is_cuda:
                    view.copy_(src.detach(), non_blocking=True)
        for view, src in pairs:  # host tensors (RNG states, step counters): small
            if not src.is_cuda:
                view.copy_(src.detach())
        event = torch.cuda.Event()
        event.record(stream)
        return event

    # --------------------------------------------------------- background

    def _worker(self, q: queue.Queue[Any], fn: Any) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            try:
                if self._error is None:
                    fn(item)
            except BaseException as exc:  # recorded, raised to training on its next call
                log.error("rank %d: checkpoint pipeline failed: %r", self.rank, exc)
                self._error = exc
                self._copied.set()
            finally:
                self._release_slot(item[1] if isinstance(item, tuple) else item.slot)

    def _copy_job(self, job: _Job) -> None:
        t0 = time.perf_counter()
        with torch.no_grad():
            for view, src in job.pairs:
                view.copy_(src.detach())
        if job.event is not None:
            job.event.synchronize()
        self._copied.set()
        t1 = time.perf_counter()
        slot = self._slots[job.slot]
        if slot is None:
            raise CheckpointError("snapshot buffer released during a copy")
        threads = self.config.checksum_threads or (4 if job.event is not None else 1)
        header = dict(job.header, checksum=checksum(self.config.checksum, slot.numpy(),
                                                    threads))
        meta = encode_meta(header, job.skeleton)
        write_file_atomic(slot.meta_path, [meta], durable=False)
        t2 = time.perf_counter()
        self.stats.copy_s += t1 - t0
        self.stats.checksum_s += t2 - t1
        step = job.step
        if self._transport is not None:
            self._hand_on("peer", (step, job.slot, meta))
        tiers = [name for name, every in (("local", self.config.local_every),
                                          ("durable", self.config.durable_every))
                 if every and step % every == 0]
        if tiers:
            self._hand_on("disk", (step, job.slot, meta, tiers))

    def _hand_on(self, stage: str, item: tuple[Any, ...]) -> None:
        with self._cv:
            self._busy[item[1]] += 1
        self._queues[stage].put(item)

    def _peer_job(self, item: tuple[int, int, bytes]) -> None:
        step, k, meta = item
        slot, transport = self._slots[k], self._transport
        if slot is None or transport is None:
            raise CheckpointError("peer backup without buffers or transport")
        t0 = time.perf_counter()
        j = self._next_backup
        incoming = transport.transfer(self._global[self.peer], Outgoing(step, meta, slot.flat),
                                      self._global[self.source], lambda n: self._backup(j, n))
        if incoming is None:
            raise PeerBackupError(f"rank {self.rank}: no backup arrived from {self.source}")
        backup = self._backups[j]
        write_file_atomic(backup.meta_path, [incoming.meta], durable=False)
        self._next_backup = (j + 1) % len(self._backups)
        self.stats.peer_s += time.perf_counter() - t0
        self.stats.peer_sends += 1
        with self._cv:  # the worker's release of the slot wakes the waiting snapshot
            self._peer_done = step if self._peer_done is None else max(self._peer_done, step)

    def _backup(self, j: int, nbytes: int) -> torch.Tensor:
        buf = self._backups[j]
        if buf is None or buf.nbytes != nbytes:
            if buf is not None:
                buf.release()
            buf = SlotBuffer(self.paths.backup(j), nbytes, shared_root=self.paths.memory_shared)
            self._backups[j] = buf
        buf.invalidate()
        return buf.flat

    def _disk_job(self, item: tuple[int, int, bytes, list[str]]) -> None:
        step, k, meta, tiers = item
        slot = self._slots[k]
        if slot is None:
            raise CheckpointError("disk write without a buffer")
        t0 = time.perf_counter()
        for tier in tiers:
            if tier == "local":
                write_disk_copy(slot.numpy(), meta, self.paths.local(step),
                                self.paths.local_shared)
                prune_local(self.paths, self.config.keep_local)
            else:
                # A missing durable root is made private: it is one user's (the run
                # directory's ckpt/), not a shared level like the memory tier's.
                write_disk_copy(slot.numpy(), meta, self.paths.durable(step),
                                self.paths.durable_shared, private_root=True)
                prune_durable(self.paths, self.config.keep_durable)
        self.stats.disk_s += time.perf_counter() - t0
        self.stats.disk_writes += len(tiers)
