"""Chunked point-to-point transfer of one snapshot between ranks (torch.distributed).

Used by the peer backup (every step: send own snapshot to the peer, receive the source's
snapshot into the backup buffer, both at once) and by restore (a holder sends a backup
back to its owner). It runs on a private process group, so it never collides with the
training's collectives. With gloo the host buffers are sent directly; with NCCL (GPU
clusters, where the fast network is attached to the GPUs) each chunk is staged through a
device buffer on a side stream.

A message is: a header (4 x int64: step, meta length, data length, 0), the meta bytes,
then the data in ``chunk_bytes`` pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

_HEADER_TAG = 1
_META_TAG = 2
_FIRST_CHUNK_TAG = 16


@dataclass
class Outgoing:
    """What to send: the step, the meta bytes and the flat uint8 data."""

    step: int
    meta: bytes
    data: torch.Tensor


@dataclass
class Incoming:
    """What arrived: the sender's step, meta bytes and the buffer holding its data."""

    step: int
    meta: bytes
    data: torch.Tensor


class Transport:
    """Send and receive snapshots over ``group`` (global ranks as peers)."""

    def __init__(self, group: dist.ProcessGroup, chunk_bytes: int,
                 device: torch.device | None = None) -> None:
        self.group = group
        self.chunk_bytes = chunk_bytes
        self.nccl = dist.get_backend(group) == "nccl"
        self.device = device
        self._stream = None
        if self.nccl:
            if device is None or device.type != "cuda":
                raise ValueError("an NCCL transport needs a CUDA device for staging")
            self._stream = torch.cuda.Stream(device=device)
            self._stage_out = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)
            self._stage_in = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)

    def transfer(self, send_to: int | None, out: Outgoing | None, recv_from: int | None,
                 alloc: Callable[[int], torch.Tensor] | None) -> Incoming | None:
        """Send ``out`` to ``send_to`` and receive from ``recv_from``, concurrently.

        ``alloc(nbytes)`` returns the uint8 CPU buffer the incoming data lands in (the
        backup slot), called once the incoming header says how big it is.
        """
        hdr_in = torch.zeros(4, dtype=torch.int64)
        hdr_out = None
        if out is not None:
            hdr_out = torch.tensor([out.step, len(out.meta), out.data.numel(), 0],
                                   dtype=torch.int64)
        self._exchange(send_to, hdr_out, recv_from, hdr_in if recv_from is not None else None,
                       _HEADER_TAG)
        meta_in = data_in = None
        if recv_from is not None:
            meta_in = torch.empty(int(hdr_in[1]), dtype=torch.uint8)
            if alloc is None:
                raise ValueError("receiving needs an alloc callback")
            data_in = alloc(int(hdr_in[2]))
        meta_out = None
        if out is not None:
            meta_out = torch.frombuffer(bytearray(out.meta), dtype=torch.uint8)
        self._exchange(send_to, meta_out, recv_from, meta_in, _META_TAG)
        n_out = out.data.numel() if out is not None else 0
        n_in = data_in.numel() if data_in is not None else 0
        self._chunks(send_to, out.data if out is not None else None, n_out,
                     recv_from, data_in, n_in)
        if recv_from is None or meta_in is None or data_in is None:
            return None
        return Incoming(step=int(hdr_in[0]), meta=meta_in.numpy().tobytes(), data=data_in)

    def _chunks(self, dst: int | None, src_buf: torch.Tensor | None, n_out: int,
                src: int | None, dst_buf: torch.Tensor | None, n_in: int) -> None:
        c = self.chunk_bytes
        count = max((n_out + c - 1) // c, (n_in + c - 1) // c)
        if not self.nccl:
            # Post everything at once; gloo matches by (peer, tag) and moves data directly.
            reqs = []
            for i in range(count):
                if dst is not None and src_buf is not None and i * c < n_out:
                    reqs.append(dist.isend(src_buf[i * c:(i + 1) * c], dst, group=self.group,
                                           tag=_FIRST_CHUNK_TAG + i))
                if src is not None and dst_buf is not None and i * c < n_in:
                    reqs.append(dist.irecv(dst_buf[i * c:(i + 1) * c], src, group=self.group,
                                           tag=_FIRST_CHUNK_TAG + i))
            for req in reqs:
                req.wait()
            return
        for i in range(count):
            send = src_buf[i * c:(i + 1) * c] if src_buf is not None and i * c < n_out else None
            recv = dst_buf[i * c:(i + 1) * c] if dst_buf is not None and i * c < n_in else None
            self._exchange(dst if send is not None else None, send,
                           src if recv is not None else None, recv, _FIRST_CHUNK_TAG + i)

    def _exchange(self, dst: int | None, send: torch.Tensor | None, src: int | None,
                  recv: torch.Tensor | None, tag: int) -> None:
        if self.nccl:
            self._exchange_nccl(dst, send, src, recv)
            return
        reqs = []
        if dst is not None and send is not None:
            reqs.append(dist.isend(send, dst, group=self.group, tag=tag))
        if src is not None and recv is not None:
            reqs.append(dist.irecv(recv, src, group=self.group, tag=tag))
        for req in reqs:
            req.wait()

    def _exchange_nccl(self, dst: int | None, send: torch.Tensor | None, src: int | None,
                       recv: torch.Tensor | None) -> None:
        # NCCL moves device memory only: stage host chunks through two device buffers on
        # a side stream, so the copies never queue behind the training's kernels.
        stream = self._stream
        if stream is None:
            raise RuntimeError("NCCL exchange on a transport built without a device")
        ops = []
        with torch.cuda.stream(stream):
            if dst is not None and send is not None:
                staged = self._stage_out[:send.numel() * send.element_size()].view(send.dtype)
                staged.copy_(send, non_blocking=True)
                ops.append(dist.P2POp(dist.isend, staged, dst, self.group))
            if src is not None and recv is not None:
                landing = self._stage_in[:recv.numel() * recv.element_size()].view(recv.dtype)
                ops.append(dist.P2POp(dist.irecv, landing, src, self.group))
            if ops:
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
            if src is not None and recv is not None:
                recv.copy_(landing, non_blocking=True)
            stream.synchronize()
