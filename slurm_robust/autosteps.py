"""Zero-code step reporting for unmodified scripts: ``python -m slurm_robust.autosteps``.

``slurm-robust submit --auto-steps -- python train.py ARGS`` runs every worker as
``python -m slurm_robust.autosteps train.py ARGS`` (``-m module ARGS`` works too). Before
the script runs as ``__main__`` (sys.argv, sys.path[0], exit status and tracebacks as
with plain ``python``), this module installs:

- a global optimizer step post-hook (``torch.optim.Optimizer``'s
  ``register_optimizer_step_post_hook``): each ``step()`` of the script's first
  optimizer appends a progress line ``{"kind": "step", "step": n, "loss": ..., "t": ...}``
  to ``$SLURM_ROBUST_PROGRESS`` (the line format of slurm_robust.train). ``n`` counts
  optimizer steps, so with gradient accumulation one step is one optimizer update;
- the loss of the last ``Tensor.backward()`` before the step, only when that tensor is
  a CPU scalar (reading a GPU value would synchronise the device every step): on GPU
  the loss is null and loss-spike detection is off;
- ``busy_s``, the fail-slow input: host time inside the outermost ``nn.Module`` forward
  calls since the previous step (the module inside a DistributedDataParallel wrapper,
  whose own forward may wait in a collective). On GPU this is launch time, a weak proxy;
- a ``final`` line at interpreter exit.

What the restored step is: the shim wraps ``torch.save``; every save to a file path
records ``{path: steps done}`` (and the file's inode, which a save to a temp file
renamed into place keeps) in ``<run_dir>/autosteps/saves-rank<r>.json``. When a
restarted script ``torch.load``s a path recorded there (any rank's record), the counter
continues from that step and a ``restored`` line tells the controller (incidents then
show the steps lost). It cannot know: checkpoints written by other means (safetensors,
numpy, torch.distributed.checkpoint), checkpoints from an earlier run directory (a
resubmission counts from 0), steps skipped inside ``optimizer.step`` by a GradScaler
that found inf gradients (the script's own counter and this one then drift), and a
script that saves and loads through file objects instead of paths. Do not combine with
slurm_robust.train (both would report steps).

Without ``$SLURM_ROBUST_PROGRESS`` (plain ``python`` or torchrun) the shim only runs the
script.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from slurm_robust.records import write_bytes_atomic
from slurm_robust.run_main import run_as_main

SAVES_VERSION = 1


class StepReporter:
    """Counts optimizer steps and writes them to the progress channel."""

    def __init__(self, progress: str | None, run_dir: str | None, rank: int) -> None:
        self.fd = (os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                   if progress else None)
        self.saves_dir = Path(run_dir) / "autosteps" if run_dir else None
        self.rank = rank
        self.step = 0
        self.stepped = False
        self.restored = False
        self._optimizer: weakref.ref[Any] | None = None
        self._loss: Any = None
        self._busy = 0.0
        self._timing: Any = None
        self._t0 = 0.0

    @classmethod
    def from_env(cls) -> StepReporter:
        return cls(os.environ.get("SLURM_ROBUST_PROGRESS"),
                   os.environ.get("SLURM_ROBUST_RUN_DIR"), int(os.environ.get("RANK", "0")))

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        """Hook torch (imported here: the shim is for torch scripts)."""
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._on_step)
        nn_module.register_module_forward_pre_hook(self._forward_pre)
        nn_module.register_module_forward_hook(self._forward_post)
        backward = torch.Tensor.backward
        real_save, real_load = torch.save, torch.load
        reporter = self

        def _backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            reporter._loss = tensor.detach() if tensor.numel() == 1 else None
            return backward(tensor, *args, **kwargs)

        def _save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            out = real_save(obj, f, *args, **kwargs)
            reporter.saved(f)
            return out

        def _load(f: Any, *args: Any, **kwargs: Any) -> Any:
            out = real_load(f, *args, **kwargs)
            reporter.loaded(f)
            return out

        torch.Tensor.backward = _backward  # type: ignore[method-assign]
        torch.save = _save
        torch.load = _load
        atexit.register(self.final)

    # ------------------------------------------------------------------ hooks
    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        first = self._optimizer() if self._optimizer is not None else None
        if first is None:
            self._optimizer = weakref.ref(optimizer)
        elif first is not optimizer:
            return  # a second optimizer (GAN, multi-optimizer): count the first one only
        self.step += 1
        self.stepped = True
        loss = None
        t = self._loss
        if t is not None and t.device.type == "cpu":
            loss = float(t.item())
        self._loss = None
        item: dict[str, Any] = {"kind": "step", "step": self.step, "loss": loss,
                                "grad_norm": None, "t": time.time(),
                                "busy_s": round(self._busy, 6)}
        self._busy, self._timing = 0.0, None
        self.report(item)

    def _forward_pre(self, module: Any, args: Any) -> None:
        if self._timing is None and type(module).__name__ != "DistributedDataParallel":
            self._timing, self._t0 = module, time.monotonic()

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if module is self._timing:
            self._busy += time.monotonic() - self._t0
            self._timing = None

    # ------------------------------------------------------------------ resume
    def saved(self, f: Any) -> None:
        if self.saves_dir is None or not isinstance(f, (str, os.PathLike)):
            return
        path = self.saves_dir / f"saves-rank{self.rank}.json"
        saves = _read_saves(path)
        saves[os.path.abspath(f)] = self.step
        inode = _inode_key(f)
        if inode:
            # A script that saves to a temp file and renames it keeps the inode.
            saves[inode] = self.step
        self.saves_dir.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, [json.dumps({"v": SAVES_VERSION, "saves": saves}).encode()],
                           durable=False)

    def loaded(self, f: Any) -> None:
        if self.saves_dir is None or self.stepped or not isinstance(f, (str, os.PathLike)):
            return
        key = os.path.abspath(f)
        inode = _inode_key(f)
        for path in sorted(self.saves_dir.glob("saves-rank*.json")):
            saves = _read_saves(path)
            step = saves.get(key, saves.get(inode) if inode else None)
            if isinstance(step, int):
                self.step = step
                if not self.restored:
                    self.restored = True
                    self.report({"kind": "restored", "step": step, "tier": None,
                                 "source": key})
                return

    # ------------------------------------------------------------------ output
    def final(self) -> None:
        self.report({"kind": "final", "step": self.step if self.stepped else None,
                     "params_sha256": None, "t": time.time()})

    def report(self, item: dict[str, Any]) -> None:
        if self.fd is None:
            return
        line = json.dumps(item, separators=(",", ":"), default=str) + "\n"
        os.write(self.fd, line.encode())


def _inode_key(f: Any) -> str | None:
    try:
        st = os.stat(f)
    except OSError:
        return None
    return f"inode:{st.st_dev}:{st.st_ino}"


def _read_saves(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    saves = raw.get("saves") if isinstance(raw, dict) else None
    return saves if isinstance(saves, dict) else {}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or (args[0] == "-m" and len(args) < 2):
        raise SystemExit("usage: python -m slurm_robust.autosteps script.py [args] | "
                         "-m module [args]")
    reporter = StepReporter.from_env()
    if reporter.fd is not None:
        reporter.install()
    run_as_main(list(args))


if __name__ == "__main__":
    main()
