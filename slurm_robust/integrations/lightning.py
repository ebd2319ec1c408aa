"""PyTorch Lightning: per-step snapshots, step reports and restore, as one ``Callback``.

    from slurm_robust.integrations.lightning import RobustCallback

    trainer = pl.Trainer(..., callbacks=[RobustCallback()])
    trainer.fit(model, datamodule)

    slurm-robust submit --nodes 2 --spares 1 -- python train_lightning.py

What it does, through :mod:`slurm_robust.train` (a no-op outside the launcher):

- ``on_fit_start`` (after the strategy has set up the process group, the wrapped model
  and the optimizer): ``train.init`` and ``restore`` the newest common snapshot into the
  LightningModule, its optimizer and LR scheduler, then the fit loop's own state (global
  step, epoch, batch progress and, for a resumable dataloader, its ``state_dict``), so
  Lightning continues from the step after the snapshot as it does from its own
  checkpoint.
- ``on_before_optimizer_step``: waits until the previous snapshot's copy has read the
  state (the only point where training waits for the checkpoint).
- ``on_train_batch_end`` after every optimizer step: reports the step and its loss (hang
  detection, progress, ETTR, NaN and spike checks) and snapshots the state with the fit
  loop's state as extras (memory every step, peer backup, disk tiers).
- ``on_validation_start``/``on_validation_end`` and ``on_save_checkpoint`` (until the
  next batch): the evaluation and save phases, each with its own hang limit
  (launcher/control/phases.py).
- ``on_fit_end``: reports the final step and the parameters' digest.

- With the ``ddp`` strategy, ``on_fit_start`` also fixes the bucket layout of
  Lightning's DistributedDataParallel (:func:`slurm_robust.ddp.fix_buckets`): DDP would
  otherwise rebuild its buckets after the first step of every process, and a restarted
  process would sum that step in another order (three or more ranks).

Under the launcher Lightning picks its ``TorchElasticEnvironment`` (the workers get
torchrun's variables, which Lightning ranks above Slurm's), so ranks and world size are
the launcher's, not srun's (whose task count includes the spares); the Trainer needs
``num_nodes * devices`` equal to ``WORLD_SIZE`` (examples/train_lightning.py reads both
from the environment). Limits, as for Lightning's own checkpoints: a restore mid-epoch
replays the same data only with a resumable dataloader (``state_dict``/
``load_state_dict``, e.g. torchdata's StatefulDataLoader); one optimizer and at most one
LR scheduler. A snapshot after an epoch's last batch restores into the next epoch, so the
loader's state taken there must resume at that epoch's first batch, not skip it
(examples/train_lightning.py's loader reports 0 batches served once all were).
"""

from __future__ import annotations

from typing import Any

try:  # the unified package first, then the standalone one; both have the same API
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        import pytorch_lightning as pl
    except ImportError as exc:
        raise ImportError("slurm_robust.integrations.lightning needs PyTorch Lightning: "
                          "pip install 'slurm-robust[lightning]'") from exc

from torch.nn.parallel import DistributedDataParallel

from slurm_robust import train
from slurm_robust.ddp import fix_buckets
from slurm_robust.launcher.enums import WorkPhase

#: Where the fit loop's state travels in a snapshot's extras.
FIT_LOOP_KEY = "lightning_fit_loop"


class RobustCallback(pl.Callback):
    """See the module docstring. ``run``: an already initialised :class:`train.RobustRun`
    (default: one is made at fit start)."""

    def __init__(self, run: train.RobustRun | None = None) -> None:
        self.run = run
        self._reported = -1

    # ----------------------------------------------------------------- restore
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.run is None:
            self.run = train.init()
        optimizer, scheduler = _optimizer_and_scheduler(trainer)
        self.run.restore(pl_module, optimizer, scheduler)
        loop_state = self.run.extras.get(FIT_LOOP_KEY)
        if self.run.restored_step is not None and loop_state is not None:
            trainer.fit_loop.load_state_dict(loop_state)
        self._reported = trainer.global_step
        wrapped = getattr(trainer.strategy, "model", None)
        if isinstance(wrapped, DistributedDataParallel):
            # Lightning's DDP would rebuild its buckets after the first step of every
            # process: a restart would sum one step in another order (slurm_robust/ddp.py).
            fix_buckets(wrapped)

    # ----------------------------------------------------------------- per step
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        if self.run is not None:
            self.run.before_update()

    # ----------------------------------------------------------------- phases
    # Validation and saves get their own hang limits (launcher/control/phases.py).
    # Lightning has no hook after a save is written: the next batch, validation or the
    # end of fit closes it.
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._enter(WorkPhase.EVAL)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave(WorkPhase.EVAL)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self._enter(WorkPhase.SAVE)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._leave(WorkPhase.SAVE)

    def _enter(self, phase: WorkPhase) -> None:
        if self.run is not None:
            self._leave(WorkPhase.SAVE)  # a save ends where the next phase begins
            if self.run.current_phase is not phase:
                self.run.enter_phase(phase)

    def _leave(self, phase: WorkPhase) -> None:
        if self.run is not None and self.run.current_phase is phase:
            self.run.leave_phase()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.run is None or step == self._reported:
            return  # a gradient-accumulation micro-batch: no optimizer step yet
        self._reported = step
        optimizer, scheduler = _optimizer_and_scheduler(trainer)
        self.run.step_end(step, _loss(outputs), None, pl_module, optimizer, scheduler,
                          data_position=step,
                          extras={FIT_LOOP_KEY: trainer.fit_loop.state_dict()})

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        # Lightning re-raises after this hook: let the snapshots already taken complete
        # first (as the training API's excepthook does), so the restart loses no step.
        if self.run is not None and self.run._mgr is not None:
            self.run._mgr.flush(timeout=10.0)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.run is not None:
            self._leave(WorkPhase.SAVE)
            # Keep the process group: it is Lightning's (test/predict may follow).
            self.run.finish(params_sha256=train.params_digest(pl_module),
                            destroy_process_group=False)


def _optimizer_and_scheduler(trainer: pl.Trainer) -> tuple[Any, Any]:
    if len(trainer.optimizers) != 1 or len(trainer.lr_scheduler_configs) > 1:
        raise ValueError(f"RobustCallback snapshots one optimizer and at most one LR "
                         f"scheduler; this model configures {len(trainer.optimizers)} and "
                         f"{len(trainer.lr_scheduler_configs)}")
    configs = trainer.lr_scheduler_configs
    return trainer.optimizers[0], configs[0].scheduler if configs else None


def _loss(outputs: Any) -> float | None:
    """The step's loss as a float (``training_step`` returned a tensor or a dict with
    ``loss``); None when it returned nothing."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return None if loss is None else float(loss.detach())
