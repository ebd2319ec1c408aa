"""Per-step checkpoints: in node shared memory, a peer backup, async disk tiers.

Imported as ``slurm_robust.ckpt``. Independent of Slurm: the launcher wires it in.

Contract for training code (one ``CheckpointManager`` per rank)::

    from slurm_robust import ckpt

    cfg = ckpt.CheckpointConfig(local_root="/local/ckpt", local_every=50,
                                durable_root="/shared/ckpt", durable_every=500)
    mgr = ckpt.CheckpointManager(cfg, rank=rank, world_size=world, node=node_name,
                                 job_id=job_id, layout=ckpt.ParallelLayout(tp=1, pp=1))
    res = mgr.restore()                     # collective; fresh start gives res.step None
    if res.step is not None:
        ckpt.apply_state(res.state, model, optimizer, scheduler)
        data_pos = res.state["data_position"]
    for step in range(start, n_steps):
        loss = model(batch(data_pos)).backward()   # forward/backward overlap the copy
        mgr.wait()                          # BEFORE optimizer.step(): the copy is done
        optimizer.step(); scheduler.step()
        mgr.snapshot(step + 1, ckpt.capture_state(model, optimizer, scheduler,
                                                   data_position=data_pos + 1))
    mgr.close()

- ``snapshot(step, state)`` returns at once (it waits only while the previous snapshot's
  peer exchange is unfinished, or the buffer it needs still serves an older snapshot's
  disk write). The state tensors are copied by a background thread (CPU) or an async
  copy on a side CUDA stream into pinned pages (GPU), into one of three preallocated
  buffers in node shared memory (two without a peer backup): with three, and the wait
  for the previous backup, a step common to all ranks survives the loss of any one node.
- ``wait()`` returns when the copy has read every live tensor; call it before anything
  mutates a state tensor (the optimizer step). Forward and backward may run meanwhile.
  Model buffers mutated by forward (BatchNorm statistics) are cloned by
  :func:`capture_state` so they do not break this contract.
- After the copy the pipeline checksums the buffer and writes its completion mark
  (memory tier), sends it in chunks to the peer rank (``pick_peers``) over a private gloo
  group (NCCL staging on GPU), and every ``local_every`` / ``durable_every`` steps writes
  it atomically to node-local disk / durable storage.
- ``restore()`` is collective: ranks exchange what copies they see, agree on the newest
  step valid for every rank (:func:`choose_restore_step`), walk tiers in the order
  memory, peer, local, durable, verify checksums, fall back past corrupt or torn copies,
  and log which tier served each rank. No copies anywhere: a fresh start (step None);
  so is a set whose missing ranks can only have had volatile copies, lost with their
  nodes before the first durable save was due. Otherwise, copies exist but no common
  valid step: :class:`NoValidCheckpointError`.

Construction and ``restore()`` are collective over all ranks (``torch.distributed`` must
be initialised when world_size > 1); every rank must call ``snapshot`` for the same steps.

On-disk and shared-memory layout (every path carries job id and node name, so deleting
a node's paths is a faithful node loss)::

    <shm_root>/<job>/<node>/rank<r>/slot<k>.data|.meta       own snapshots (k = 0..2)
    <shm_root>/<job>/<node>/rank<r>/backup<k>.data|.meta     the peer's snapshot
    <local_root>/<node>/<job>/rank<r>/step<s>.data|.meta     node-local disk tier
    <durable_root>/<job>/step<s>/rank<r>.data|.meta          durable tier

``.data`` holds the tensors, packed and 64-byte aligned; ``.meta`` is the completion
mark, written atomically after the data: a JSON header (format 2: step, rank, world size,
layout, node, job, byte count, checksum, tensor table) with its own CRC32, and the
non-tensor skeleton as tagged JSON (never pickle: nothing read back is executable).
``<job>`` is the job id plus a keyed hash of the run secret (the launcher's
``job_key``), or ``<job id>.u<uid>`` outside the launcher (a directory of that name someone
else made first is refused, naming its owner), and every level below a shared root is
private (0700, ours), walked with
O_NOFOLLOW and checked on every use, so other users cannot plant directories, links or
copies there (slurm_robust.secure_fs). A durable root that does not exist yet is made
0700 (it is one user's, e.g. the run directory's ``ckpt/``), not a shared 1777 level. Shared
memory files outlive a crashed worker (tmpfs); :func:`purge_job_memory` removes them and
belongs to whoever owns the node's lifetime for the job (the agent, or the epilog).

Host memory per rank: ``3 x state`` for its own snapshots (``2 x`` without a peer
backup) plus ``peer_slots x`` one peer's state for the backup
(``CheckpointManager.host_bytes()`` reports it).
"""

from __future__ import annotations

import importlib
from typing import Any

from slurm_robust.ckpt.config import TIERS, CheckpointConfig, purge_job_memory
from slurm_robust.ckpt.errors import CheckpointError, NoValidCheckpointError, PeerBackupError
from slurm_robust.ckpt.layout import ParallelLayout, backup_sources, pick_peers
from slurm_robust.ckpt.plan import CopyInfo, RestorePlan, RestoreResult, choose_restore_step

# Names whose modules import torch load on first use, so that importing this package
# (the CLI's bench dispatcher, an agent that only purges memory) stays fast.
_LAZY = {
    "CheckpointManager": "slurm_robust.ckpt.manager",
    "apply_state": "slurm_robust.ckpt.state",
    "capture_state": "slurm_robust.ckpt.state",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "TIERS",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointManager",
    "CopyInfo",
    "NoValidCheckpointError",
    "ParallelLayout",
    "PeerBackupError",
    "RestorePlan",
    "RestoreResult",
    "apply_state",
    "backup_sources",
    "capture_state",
    "choose_restore_step",
    "pick_peers",
    "purge_job_memory",
]
