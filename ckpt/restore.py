"""Collective restore: exchange inventories, agree on a step, load, fall back on damage."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from slurm_robust.ckpt.blob import (
    DATA_SUFFIX,
    META_SUFFIX,
    CorruptCopyError,
    decode_meta,
    read_data_into,
    read_meta,
    unflatten,
    verify,
)
from slurm_robust.ckpt.blob import TensorSpec as Spec
from slurm_robust.ckpt.config import CkptPaths
from slurm_robust.ckpt.errors import CheckpointError
from slurm_robust.ckpt.plan import CopyInfo, RestorePlan, RestoreResult, choose_restore_step
from slurm_robust.ckpt.slots import tensor_views
from slurm_robust.ckpt.tiers import scan_copies
from slurm_robust.ckpt.transport import Outgoing, Transport

log = logging.getLogger("slurm_robust.ckpt")

#: Each failed load excludes at least one copy; this bounds the re-planning rounds.
MAX_ATTEMPTS = 8


def restore(paths: CkptPaths, world_size: int, layout: dict[str, Any], backup_slots: int,
            ctl: dist.ProcessGroup | None, transport: Transport | None,
            global_ranks: list[int], durable_every: int | None = None) -> RestoreResult:
    """Run the restore protocol for rank ``paths.rank`` (collective when ctl is set);
    ``durable_every``: see :func:`~slurm_robust.ckpt.plan.choose_restore_step`."""
    t0 = time.perf_counter()
    me = paths.rank
    mine = scan_copies(paths, world_size, layout, backup_slots)
    copies = [c for part in _gather(mine, ctl, world_size) for c in part]
    excluded: list[CopyInfo] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        plan = choose_restore_step(copies, world_size, excluded, durable_every)
        if plan is None:
            log.warning("rank %d: fresh start: %s", me,
                        "only some ranks' volatile copies are left (the others went with "
                        "their nodes) and no durable save was due yet" if copies else
                        "no checkpoint copies found")
            return RestoreResult(step=None, seconds=time.perf_counter() - t0,
                                 attempts=attempt)
        failed: CopyInfo | None = None
        state: dict[str, Any] | None = None
        try:
            state = _load(plan, me, paths, transport, global_ranks)
        except (CorruptCopyError, OSError, ValueError, CheckpointError, KeyError,
                TypeError, IndexError) as exc:
            # Any damage to this rank's copy (including a header that decodes but
            # does not fit the data) excludes the copy; it never ends the restore.
            failed = plan.sources[me]
            log.warning("rank %d: copy of step %d from %s tier failed to load (%s); "
                        "it is excluded and the ranks re-plan", me, plan.step, failed.tier, exc)
        failures = [f for f in _gather(failed, ctl, world_size) if f is not None]
        if not failures:
            tiers = plan.tiers()
            log.info("rank %d restored step %d from the %s tier (all ranks: %s)", me,
                     plan.step, tiers[me], _summary(tiers))
            return RestoreResult(step=plan.step, tiers=tiers, state=state,
                                 seconds=time.perf_counter() - t0, attempts=attempt)
        excluded.extend(failures)
    raise CheckpointError(f"restore gave up after {MAX_ATTEMPTS} attempts; failed copies: "
                          f"{excluded}")


def restore_own(paths: CkptPaths, world_size: int, layout: dict[str, Any],
                backup_slots: int, step: int) -> RestoreResult:
    """Load this rank's own copy of ``step`` (memory, then local, then durable) with no
    collective: a dual-phase replay's groups are worlds of their own, and the step is
    the controller's (the last one every rank snapshotted). Raises CheckpointError when
    no copy of that step loads."""
    t0 = time.perf_counter()
    me = paths.rank
    order = {tier: i for i, tier in enumerate(("memory", "local", "durable"))}
    mine = sorted((c for c in scan_copies(paths, world_size, layout, backup_slots)
                   if c.rank == me and c.holder == me and c.step == step and c.valid
                   and c.tier in order), key=lambda c: order[c.tier])
    errors = []
    for copy in mine:
        try:
            base = Path(copy.path)
            header, skeleton = read_meta(base)
            buf = np.empty(int(header["nbytes"]), dtype=np.uint8)
            read_data_into(base, header, buf)
            state = _build(header, skeleton, torch.from_numpy(buf), step, me)
        except (CorruptCopyError, OSError, ValueError, CheckpointError, KeyError,
                TypeError, IndexError) as exc:
            errors.append(f"{copy.tier}: {exc}")
            continue
        return RestoreResult(step=step, tiers={me: copy.tier}, state=state,
                             seconds=time.perf_counter() - t0, attempts=1)
    raise CheckpointError(f"rank {me} has no loadable copy of step {step} "
                          f"({'; '.join(errors) or 'none found'})")


def _summary(tiers: dict[int, str]) -> str:
    counts: dict[str, list[int]] = {}
    for rank, tier in tiers.items():
        counts.setdefault(tier, []).append(rank)
    return ", ".join(f"{tier}: ranks {ranks}" for tier, ranks in counts.items())


def _gather(obj: Any, ctl: dist.ProcessGroup | None, world_size: int) -> list[Any]:
    if ctl is None:
        return [obj]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj, group=ctl)
    return out


def _load(plan: RestorePlan, me: int, paths: CkptPaths, transport: Transport | None,
          global_ranks: list[int]) -> dict[str, Any]:
    """Load this rank's copy; serve the backup this rank holds to its owner if planned."""
    mine = plan.sources[me]
    serve = [c for c in plan.sources.values() if c.tier == "peer" and c.holder == me]
    if (mine.tier == "peer" or serve) and transport is None:
        raise CheckpointError("the plan needs a peer transfer but no peer transport exists")
    out = None
    if serve:
        base = Path(serve[0].path)
        raw_meta = base.with_name(base.name + META_SUFFIX).read_bytes()
        header, _ = decode_meta(raw_meta, str(base))
        data = torch.from_file(str(base.with_name(base.name + DATA_SUFFIX)), shared=False,
                               size=int(header["nbytes"]), dtype=torch.uint8)
        out = (global_ranks[serve[0].rank], Outgoing(header["step"], raw_meta, data))
    if transport is not None and (mine.tier == "peer" or out is not None):
        incoming = transport.transfer(
            out[0] if out else None, out[1] if out else None,
            global_ranks[mine.holder] if mine.tier == "peer" else None,
            lambda n: torch.empty(n, dtype=torch.uint8))
        if mine.tier == "peer":
            if incoming is None:
                raise CheckpointError(f"no data arrived from rank {mine.holder}")
            header, skeleton = decode_meta(incoming.meta, f"backup from rank {mine.holder}")
            verify(header, incoming.data.numpy(), f"backup from rank {mine.holder}")
            return _build(header, skeleton, incoming.data, plan.step, me)
    base = Path(mine.path)
    header, skeleton = read_meta(base)
    buf = np.empty(int(header["nbytes"]), dtype=np.uint8)
    read_data_into(base, header, buf)
    return _build(header, skeleton, torch.from_numpy(buf), plan.step, me)


def _build(header: dict[str, Any], skeleton: Any, flat: torch.Tensor, step: int,
           rank: int) -> dict[str, Any]:
    if header["step"] != step or header["rank"] != rank:
        raise CorruptCopyError(f"copy holds step {header['step']} of rank {header['rank']}, "
                               f"expected step {step} of rank {rank}")
    specs = [Spec(d, tuple(shape), off, n) for d, shape, off, n in header["tensors"]]
    # Private copies: optimizers alias the tensors they are given, and the source
    # buffer is reused by later snapshots or transfers.
    tensors = [v.clone() for v in tensor_views(flat, specs)]
    return unflatten(skeleton, tensors)
