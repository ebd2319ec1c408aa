"""The fault-free reference digest: a training script run standalone as ``world`` ranks.

Every recovered run is judged by its final ``params_sha256=`` against the same script run
with torchrun's variables on this host, no Slurm and no launcher. Shared by the
integration tests (which cache it per session) and the rehearsal benchmarks.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Callable

from slurm_robust.errors import SlurmRobustError

# What a gloo rank prints when it aborts in process teardown after its last collective (a
# thread of its store or transport still running as the interpreter exits): seen in a
# fresh-clone run of the hot-update test's reference, after rank 0 printed its digest.
TEARDOWN_ABORT = "terminate called without an active exception"


class ReferenceFailed(SlurmRobustError):
    """The standalone reference did not finish or did not print its digest."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the kernel just handed out as free: references of
    two pytest workers run at once on this host's loopback, and fixed bases collided."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def standalone_params_digest(argv: list[str], world: int, timeout_s: float = 300.0,
                             env_extra: Callable[[int], dict[str, str]] | None = None,
                             drop_env: tuple[str, ...] = ()) -> str:
    """Run ``argv`` as ``world`` local ranks (gloo on 127.0.0.1) and return rank 0's
    ``params_sha256=`` digest. ``env_extra(rank)``: more variables for that rank;
    ``drop_env``: variables of this process the ranks must not inherit.

    A rank that exited non-zero fails the reference, except for the teardown abort above
    once rank 0 has printed its digest: the digest is taken after the last step's
    all-reduce, which needs every rank's gradients, so an abort after it changes nothing.
    """
    port = str(free_port())
    procs, files = [], []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.update(env_extra(rank) if env_extra else {})
        for var in drop_env:
            env.pop(var, None)
        # Files, not pipes: a rank blocked on a full pipe would stall the others'
        # collectives while this process waits on rank 0.
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        files.append((out, err))
        procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True))
    try:
        for p in procs:
            p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        for p in procs:
            p.kill()
            p.wait()
        raise ReferenceFailed(f"the standalone reference did not finish in {timeout_s:g} s"
                              ) from exc
    outs = []
    for out, err in files:
        out.seek(0)
        err.seek(0)
        outs.append((out.read(), err.read()))
        out.close()
        err.close()
    digest = next((ln.split("=")[1].split()[0] for ln in outs[0][0].splitlines()
                   if ln.startswith("params_sha256=")), None)

    def clean(i: int) -> bool:
        if procs[i].returncode == 0:
            return True
        tail = outs[i][1].strip().splitlines()[-1:]
        return digest is not None and tail == [TEARDOWN_ABORT]

    if digest is None or not all(clean(i) for i in range(world)):
        detail = [(r, p.returncode, out[-500:], err[-1500:])
                  for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True))
                  if not clean(r) or r == 0]
        raise ReferenceFailed(f"the standalone reference of {world} ranks failed: {detail}")
    return digest
