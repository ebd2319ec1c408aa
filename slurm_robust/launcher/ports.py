"""The workers' rendezvous ports: which ones a run may use and which one each attempt takes.

A leaf: the run config checks its ``master_port`` against the span when it is built, and
the controller picks each attempt's port from it.
"""

from __future__ import annotations

import zlib

PORT_SPAN = 8192  # at most this many rendezvous ports above the configured base
#: Start of Linux's default ephemeral range (net.ipv4.ip_local_port_range 32768-60999).
#: Outgoing connections (gloo's mesh, Slurm's RPCs, the agents' own) take local ports
#: there at random, and a listener cannot bind a port one of them holds (EADDRINUSE):
#: a rendezvous port in that range fails now and then on a busy node.
EPHEMERAL_FIRST = 32768
PORT_BUCKET = 32  # ports per job: one per attempt, reused after 32 attempts


def port_span(base: int) -> int:
    """How many ports above ``base`` the rendezvous uses: up to PORT_SPAN, never into
    the default ephemeral range from below, whole buckets only (0: no room)."""
    room = EPHEMERAL_FIRST - base if base < EPHEMERAL_FIRST else 65536 - base
    return max(0, min(PORT_SPAN, room)) // PORT_BUCKET * PORT_BUCKET


def rendezvous_port(base: int, job_id: str | None, attempt: int) -> int:
    """The workers' MASTER_PORT for one attempt: spread by job, fresh per attempt.

    Jobs that share a host (the mini-cluster, or nodes shared between jobs) should not
    pick the same port, and each attempt takes a new one so sockets in TIME_WAIT never
    block a restart: ``port_span(base) / 32`` job buckets (102 above the default 29500)
    of 32 attempts each. Two jobs sharing a host land in one bucket with probability
    1/buckets; the collision is then a failed rendezvous, restarted on the next port.
    """
    buckets = max(1, port_span(base) // PORT_BUCKET)
    bucket = zlib.crc32(str(job_id or "").encode()) % buckets
    return base + bucket * PORT_BUCKET + attempt % PORT_BUCKET
