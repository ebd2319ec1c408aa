"""The bitwise reference test: one fixed forward and backward step, hashed.

Every rank of the job runs the same computation at the same moment (fixed weights, input
and seed, independent of the training): a two-layer MLP, its loss and its gradients,
hashed bit for bit. Healthy nodes of one kind give the same digest; a node whose
arithmetic silently corrupts data gives another, and the controller evicts it with both
digests as the evidence (control/bitwise.py compares them).

The sizes are small on purpose: a handful of milliseconds, and a single-threaded
reduction order on CPU, so the digest depends on the hardware's arithmetic, not on a
thread count.
"""

from __future__ import annotations

import hashlib
from typing import Any

REFERENCE_SEED = 20251130
#: Inputs x hidden x outputs of the reference MLP.
SHAPE = (32, 64, 16)


def reference_digest(device: str = "cpu", corrupt: bool = False) -> str:
    """SHA-256 over the reference step's loss and gradients (``corrupt``: the
    rehearsal's faulty node, ``inject sdc --bitwise``, flips one bit of a gradient)."""
    import torch

    g = torch.Generator().manual_seed(REFERENCE_SEED)
    n_in, n_hidden, n_out = SHAPE
    w1 = torch.randn(n_in, n_hidden, generator=g).to(device).requires_grad_()
    w2 = torch.randn(n_hidden, n_out, generator=g).to(device).requires_grad_()
    x = torch.randn(8, n_in, generator=g).to(device)
    y = torch.randn(8, n_out, generator=g).to(device)
    loss = ((torch.tanh(x @ w1) @ w2 - y) ** 2).mean()
    loss.backward()
    tensors: list[Any] = [loss.detach(), w1.grad, w2.grad]
    h = hashlib.sha256()
    for i, t in enumerate(tensors):
        data = bytearray(t.detach().cpu().contiguous().numpy().tobytes())
        if corrupt and i == 1:
            data[5] ^= 0x10  # one flipped bit, as a faulty ALU or SRAM cell would
        h.update(bytes(data))
    return h.hexdigest()
