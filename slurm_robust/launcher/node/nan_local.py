"""A rank's own NaN evidence, taken before the gradient collective.

A non-finite value that appears on one rank reaches every rank through the gradient
all-reduce: after it, every rank sees a NaN grad norm and the first one to report is
not the one where it began. Before the collective only the origin rank has it, so
``RobustRun.local_check`` looks at this rank's own loss and local grad norm there and
says in its ``anomaly`` line whether the value was local (``local: true``), came in
through the collective (``local: false``) or was not checked (no ``local`` key: origin
unknown).

Also here, the worker's side of the files the controller and the rehearsal tools put in
``<run_dir>/nan/``:

- ``skip.json``: steps whose batch the user's ``skip`` policy drops (read at start);
- ``poison.json``: ``inject nan --mode data``, a poisoned sample at one step on one rank
  (its gradients become NaN at that step on every replay);
- ``sdc.json``: ``inject sdc``, one node's gradients corrupted at random steps (a new
  draw per attempt, so the corruption moves between replays);
- ``bitwise.json``: the controller's request that every rank of one attempt run the
  bitwise reference test at its start (reference_step.py).
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_robust.launcher.nan_files import (  # noqa: F401 - the files' names, re-exported
    BITWISE_FILE,
    NAN_DIR,
    NAN_FILES_VERSION,
    POISON_FILE,
    SDC_FILE,
    SKIP_FILE,
    nan_dir,
)
from slurm_robust.run_dir_trust import read_trusted_json
from slurm_robust.secure_fs import UnsafePathError


# open-ended: any of the NaN ladder's files, raw; each caller checks the keys it reads
def read_json(path: Path) -> dict[str, Any] | None:
    """The file's object, or None when absent or unreadable (a rehearsal file being
    replaced, a skip list not written yet): never fatal to a training step."""
    try:
        # Written by the controller; one not the run's own (planted) is not read.
        raw = read_trusted_json(path)
    except (OSError, ValueError, UnsafePathError):
        return None
    return raw if isinstance(raw, dict) else None


def local_grad_norm(params: Any) -> float:
    """The L2 norm of this rank's own gradients (before any collective), in float64 so
    a large finite gradient does not read as an overflow."""
    import torch

    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        grad = getattr(p, "grad", None)
        if grad is not None:
            total += grad.detach().double().pow(2).sum()
    return float(total.sqrt())


def non_finite(loss: float | None, norm: float | None) -> str | None:
    """Which local value is non-finite (``loss`` first), else None."""
    if loss is not None and not math.isfinite(loss):
        return "loss"
    if norm is not None and not math.isfinite(norm):
        return "local_grad_norm"
    return None


def skipped_steps(run_dir: str | Path | None) -> frozenset[int]:
    """Steps whose batch the controller asked to skip (the ``skip`` NaN policy)."""
    if not run_dir:
        return frozenset()
    raw = read_json(nan_dir(run_dir) / SKIP_FILE) or {}
    steps = raw.get("steps") or []
    return frozenset(int(s) for s in steps if isinstance(s, int))


@dataclass(frozen=True)
class Rehearsal:
    """The rehearsal faults that apply to one rank (from ``poison.json``/``sdc.json``)."""

    poison_step: int | None = None
    sdc_probability: float = 0.0
    sdc_seed: int = 0
    #: The injections' ids: a new injection reads as a change even with equal values.
    ids: tuple[str, ...] = ()
    #: ``inject sdc --bitwise``: the node also fails the bitwise reference test.
    sdc_bitwise: bool = False

    def corrupts(self, step: int, attempt: int, replaying: bool = False) -> str | None:
        """``"data"`` when the poisoned sample is at ``step``, ``"sdc"`` when this
        attempt's draw for ``step`` corrupts the node, else None. ``replaying``: the
        attempt is one group of a dual-phase replay."""
        if self.poison_step is not None and step == self.poison_step:
            return "data"
        if not self._sdc_hit(step, attempt):
            return None
        # A step corrupted in the previous attempt is spared in this one: the rehearsed
        # corruption always moves from one ladder attempt to the next (a real one does so
        # by chance). A replay group's attempt number follows another group's, not the
        # NaN's attempt, so sparing there would only thin the draws: at p=0.5 over a
        # 17-step window it left the corrupt node's group clean in about 1 run in 50
        # (an inconclusive replay the rehearsal caused, not the ladder).
        if replaying or not self._sdc_hit(step, attempt - 1):
            return "sdc"
        return None

    def _sdc_hit(self, step: int, attempt: int) -> bool:
        if self.sdc_probability <= 0:
            return False
        key = zlib.crc32(f"{self.sdc_seed}/{attempt}/{step}".encode())
        return random.Random(key).random() < self.sdc_probability


def load_rehearsal(run_dir: str | Path | None, rank: int, node: str) -> Rehearsal:
    if not run_dir:
        return Rehearsal()
    d = nan_dir(run_dir)
    poison = read_json(d / POISON_FILE) or {}
    sdc = read_json(d / SDC_FILE) or {}
    step = poison.get("step") if poison.get("rank") == rank else None
    prob = float(sdc.get("probability") or 0.0) if sdc.get("node") == node else 0.0
    ids = tuple(str(r.get("id")) for r, mine in ((poison, step is not None), (sdc, prob > 0))
                if mine)
    return Rehearsal(poison_step=step if isinstance(step, int) else None,
                     sdc_probability=prob, sdc_seed=int(sdc.get("seed") or 0), ids=ids,
                     sdc_bitwise=bool(sdc.get("bitwise")) and prob > 0)


def bitwise_request(run_dir: str | Path | None, attempt: int) -> str | None:
    """The id of the controller's bitwise-test request for ``attempt``, if any."""
    if not run_dir:
        return None
    raw = read_json(nan_dir(run_dir) / BITWISE_FILE) or {}
    return str(raw["id"]) if raw.get("attempt") == attempt and raw.get("id") else None


def corrupt_gradients(params: Any) -> None:
    """The rehearsal's corruption: this rank's first gradient becomes NaN (what a bad
    sample or a flipped exponent bit does to it), before the collective spreads it."""
    import torch

    for p in params:
        grad = getattr(p, "grad", None)
        if grad is not None:
            with torch.no_grad():
                grad.view(-1)[0] = float("nan")
            return
