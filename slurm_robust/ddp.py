"""A DistributedDataParallel wrapper whose gradient buckets are the same in every process.

Why: DDP builds its first buckets in parameter declaration order and, at the second
forward of every new process, *rebuilds* them in the order the gradients became ready
in the first backward. A restarted process therefore reduces its first step with the
declaration-order layout, where the uninterrupted run already used the rebuilt one. The
layout decides where each gradient element sits in the flat bucket, and so which chunk
of the ring all-reduce sums it and in which order the ranks' values are added: with
three or more ranks (floating-point addition is commutative, not associative, so two
ranks never differ) that one step's gradients differ in the last bits, and the run is no
longer bit-identical to its fault-free twin.

The fix: :func:`wrap_ddp` asks the reducer for its one-time rebuild right away, from
every parameter in declaration order (``Reducer._push_all_rebuilt_params``, what DDP's
own join hook uses for a rank without inputs). The rebuild then happens at the first
forward of every process, to the same layout, and never again: every step of every
process reduces with identical buckets. The cost is the layout: buckets follow
declaration order instead of the backward's ready order, so a model declared far from
its execution order overlaps communication with the backward less well.

``find_unused_parameters=True`` already never rebuilds (the layout is fixed from the
start) and is left as it is.
"""

from __future__ import annotations

import warnings
from typing import Any


def wrap_ddp(model: Any, **kwargs: Any) -> Any:
    """``DistributedDataParallel(model, **kwargs)`` with a fixed bucket layout (see the
    module docstring). Call it in every process, fresh start and restart alike."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return fix_buckets(DDP(model, **kwargs))


def fix_buckets(ddp: Any) -> Any:
    """Fix the bucket layout of a DistributedDataParallel module someone else built (a
    framework's strategy), before its first forward; returns it."""
    if getattr(ddp, "find_unused_parameters", False):
        return ddp
    push = getattr(ddp.reducer, "_push_all_rebuilt_params", None)
    if push is None:
        warnings.warn("this torch has no Reducer._push_all_rebuilt_params: DDP will "
                      "rebuild its buckets after the first step of each process, and a "
                      "restart may not be bit-identical", RuntimeWarning, stacklevel=3)
        return ddp
    push()
    return ddp
