"""Hugging Face transformers: per-step snapshots, step reports and restore for ``Trainer``.

    from slurm_robust.integrations.hf import RobustCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[RobustCallback()])
    trainer.train()

    slurm-robust submit --nodes 2 --spares 1 -- python train_hf.py

What it does, through :mod:`slurm_robust.train` (a no-op outside the launcher):

- ``on_train_begin`` (the Trainer has built the process group, wrapped the model and
  created the optimizer and the LR scheduler): ``train.init`` and ``restore`` the newest
  common snapshot into the model, the optimizer and the scheduler, then the Trainer's
  counters (global step, epoch, FLOs, tokens seen, best metric). The Trainer's own loop
  has already decided to start at epoch 0, batch 0, so the callback skips the data
  itself: it sets ``skip_batches`` of the Trainer's (accelerate-prepared) dataloader,
  the mechanism the Trainer's own ``resume_from_checkpoint`` uses, to every batch of the
  epochs already done and to the consumed batches of the current one.
- A snapshot of step ``k`` is taken at ``on_step_begin`` of step ``k + 1`` (and at train
  end for the last step), through ``run.step_end`` with the step's loss and grad norm as
  the Trainer logged them: that is the last point before the next forward, after the
  step's logging, evaluation and checkpointing and after the next batch was fetched
  (which, at an epoch boundary, draws a seed from the global RNG). The restored RNG
  state is applied at the same point, so a resumed run draws what the uninterrupted one
  drew and ends bit-identical with it.
- ``on_pre_optimizer_step``: waits until the previous snapshot's copy has read the
  state (the only point where training waits for the checkpoint).
- Evaluation and saves: the Trainer evaluates and saves after ``on_step_end`` when the
  flow callback set ``control.should_evaluate``/``should_save``; this callback reports
  the evaluation phase from there to ``on_evaluate`` and the save phase from there to
  ``on_save`` (each its own hang limit, launcher/control/phases.py).
- ``on_train_end``: reports the final step and the parameters' digest.
- With DDP (several processes), the first forward of the Trainer's
  DistributedDataParallel fixes its bucket layout first
  (:func:`slurm_robust.ddp.fix_buckets`): DDP would otherwise rebuild its buckets after
  the first step of every process, and a restarted process would sum that step in
  another order (three or more ranks). The callback gets the unwrapped model only, so it
  finds the wrapper with a global forward pre-hook, removed at the first forward with
  gradients. (With ``ddp_find_unused_parameters=True``, the Trainer's default unless
  activation checkpointing is on, DDP never rebuilds and there is nothing to fix.)

Per-step losses need ``logging_steps=1`` (the loss is the Trainer's logged mean over the
ranks; a step that is not logged is reported without a loss, which hang detection and
progress still use). The data order must be a function of the seed and the epoch, as it
is with the Trainer's default seedable sampler (accelerate's ``use_seedable_sampler``).

Limits: the training dataset needs a length (map-style, not an IterableDataset); the
skipped batches are still read (as accelerate's ``skip_batches`` does), so a restore late
in a long run reads that much data again without training on it; the Trainer warns
once for each epoch skipped whole ("There seems not to be a single sample in your
epoch_iterator"), which the callback answers by keeping training going. With
``gradient_accumulation_steps > 1`` an epoch's batch count must be a multiple of it for
a mid-epoch restore (the Trainer would otherwise not step on the epoch's last, partial
accumulation). ``log_history`` is not snapshotted (it grows with every log); the first
loss logged after a restore is rescaled to the steps since the restore. Do not combine
with ``trainer.train(resume_from_checkpoint=...)``.
"""

from __future__ import annotations

from typing import Any

try:
    import transformers
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError("slurm_robust.integrations.hf needs transformers and accelerate: "
                      "pip install 'slurm-robust[hf]'") from exc

import torch
from torch.nn.parallel import DistributedDataParallel

from slurm_robust import train
from slurm_robust.ckpt.state import rng_state, set_rng_state
from slurm_robust.ddp import fix_buckets
from slurm_robust.launcher.enums import WorkPhase

#: Where the Trainer's counters travel in a snapshot's extras.
TRAINER_STATE_KEY = "hf_trainer_state"
#: The TrainerState fields snapshotted (log_history is not: it grows with every log).
STATE_FIELDS = ("global_step", "epoch", "total_flos", "num_input_tokens_seen",
                "best_metric", "best_global_step", "best_model_checkpoint")

TrainerCallback = transformers.TrainerCallback


class RobustCallback(TrainerCallback):
    """See the module docstring. ``run``: an already initialised :class:`train.RobustRun`
    (default: one is made at train begin)."""

    def __init__(self, run: train.RobustRun | None = None) -> None:
        self.run = run
        self._pending: dict[str, Any] | None = None  # the finished step, not yet reported
        self._restored: int | None = None
        self._rng: dict[str, Any] | None = None  # the restored RNG, applied at step begin
        self._skip: tuple[int, int] = (0, 0)  # (epochs done, batches done in the next)
        self._loop_epoch = 0
        self._done = False
        self._rescale_log = False
        self._hook: Any = None

    # ----------------------------------------------------------------- restore
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if self.run is None:
            self.run = train.init()
        self._pending, self._restored, self._rng, self._loop_epoch = None, None, None, 0
        self._skip, self._done, self._rescale_log = (0, 0), False, False
        started_at = state.global_step
        self.run.restore(model, optimizer, lr_scheduler)
        saved = self.run.extras.get(TRAINER_STATE_KEY)
        if self.run.restored_step is not None and saved is not None:
            if started_at:
                raise ValueError("RobustCallback restored a snapshot, but the Trainer "
                                 f"already resumed from its own checkpoint (global step "
                                 f"{started_at}): call trainer.train() without "
                                 "resume_from_checkpoint under the launcher")
            # The next forward must draw what the uninterrupted run drew after this
            # snapshot: re-applied at the next step begin, after the skipped batches.
            self._rng = rng_state()
            for name in STATE_FIELDS:
                if name in saved:
                    setattr(state, name, saved[name])
            self._restored = state.global_step
            self._rescale_log = True
            self._plan_skip(args, state, train_dataloader)
        self._install_bucket_fix(model)

    def _plan_skip(self, args: Any, state: Any, loader: Any) -> None:
        """Which batches the Trainer's loop, restarted at epoch 0, must not train on."""
        try:
            per_epoch = len(loader)
        except TypeError as exc:
            raise TypeError("RobustCallback resumes at a batch of an epoch, so it needs a "
                            "training dataset with a length (a map-style Dataset, not an "
                            "IterableDataset)") from exc
        accum = args.gradient_accumulation_steps
        updates = per_epoch // accum + int(per_epoch % accum > 0)
        epochs, update_in_epoch = divmod(state.global_step, updates)
        batches = update_in_epoch * accum
        if batches and per_epoch % accum:
            raise ValueError(f"RobustCallback cannot resume mid-epoch with "
                             f"gradient_accumulation_steps={accum} and {per_epoch} batches "
                             "an epoch (the Trainer would not step on the epoch's last, "
                             "partial accumulation): make the batches an epoch a multiple "
                             "of gradient_accumulation_steps")
        if not hasattr(loader, "skip_batches"):
            raise TypeError(f"RobustCallback resumes by setting skip_batches of the "
                            f"Trainer's dataloader; {type(loader).__name__} has none (a "
                            "Trainer whose get_train_dataloader is overridden must still "
                            "return accelerator.prepare(...)'s loader)")
        self._skip = (epochs, batches)
        self._done = state.max_steps > 0 and state.global_step >= state.max_steps

    def on_epoch_begin(self, args: Any, state: Any, control: Any,
                       train_dataloader: Any = None, **kwargs: Any) -> None:
        if self._restored is None:
            return
        epochs, batches = self._skip
        if self._done or self._loop_epoch < epochs:
            skip = len(train_dataloader)  # an epoch done before the snapshot
        elif self._loop_epoch == epochs:
            skip = batches
        else:
            skip = 0
        train_dataloader.skip_batches = skip

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._restored is not None and not self._done and self._loop_epoch < self._skip[0]:
            # An epoch skipped whole: the Trainer stops on an epoch without a batch, and
            # the epoch-end flow would log, evaluate or save for it. None of it happened.
            control.should_training_stop = False
            control.should_log = control.should_evaluate = control.should_save = False
        # Not a snapshot point: the next epoch's first batch, and the seed its iterator
        # draws, come before the next step begin, where the snapshot is taken.
        self._loop_epoch += 1
        self._next_phase(control)  # an epoch-end evaluation or save

    # ----------------------------------------------------------------- per step
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # A phase the Trainer announced but skipped (nothing to evaluate) ends here.
        self._leave(WorkPhase.SAVE)
        self._leave(WorkPhase.EVAL)
        self._flush(state)
        if self._rng is not None:
            set_rng_state(self._rng)
            self._rng = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                              **kwargs: Any) -> None:
        if self.run is not None:
            self.run.before_update()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None,
                    optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        if self.run is None:
            return
        epochs, batches = self._skip
        if self._restored is not None and self._loop_epoch == epochs and batches:
            # The Trainer counts the epoch's batches from the first it was handed.
            state.epoch += batches / max(1, len(kwargs["train_dataloader"]))
        self._pending = {"step": state.global_step, "loss": None, "grad_norm": None,
                         "model": model, "optimizer": optimizer, "scheduler": lr_scheduler}
        # The flow callback ran before this one (the Trainer's default callbacks come
        # first): its decisions say what the Trainer does next.
        self._next_phase(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave(WorkPhase.EVAL)
        self._next_phase(control)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._leave(WorkPhase.SAVE)

    def _next_phase(self, control: Any) -> None:
        """Enter the phase the Trainer runs next: evaluation before the save."""
        if self.run is None:
            return
        if getattr(control, "should_evaluate", False):
            self._enter(WorkPhase.EVAL)
        elif getattr(control, "should_save", False):
            self._enter(WorkPhase.SAVE)

    def _enter(self, phase: WorkPhase) -> None:
        if self.run is not None and self.run.current_phase is not phase:
            self.run.enter_phase(phase)

    def _leave(self, phase: WorkPhase) -> None:
        if self.run is not None and self.run.current_phase is phase:
            self.run.leave_phase()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        pending = self._pending
        if pending is None or not logs or "loss" not in logs:
            return
        if self._rescale_log and self._restored is not None:
            # The Trainer divides the first logged loss by the steps since ITS start (0),
            # not since the restore.
            self._rescale_log = False
            done = state.global_step - self._restored
            if done > 0:
                logs["loss"] = logs["loss"] * state.global_step / done
                if state.log_history and "loss" in state.log_history[-1]:
                    state.log_history[-1]["loss"] = logs["loss"]
        pending["loss"] = _float(logs.get("loss"))
        pending["grad_norm"] = _float(logs.get("grad_norm"))

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None,
                     **kwargs: Any) -> None:
        self._flush(state)
        self._remove_hook()
        if self.run is not None:
            # Keep the process group: it is the Trainer's (evaluate/predict may follow).
            self.run.finish(params_sha256=train.params_digest(model),
                            destroy_process_group=False)

    def _flush(self, state: Any) -> None:
        """Report and snapshot the finished step (see the module docstring for when)."""
        pending, self._pending = self._pending, None
        if pending is None or self.run is None:
            return
        saved = {name: getattr(state, name) for name in STATE_FIELDS}
        self.run.step_end(pending["step"], pending["loss"], pending["grad_norm"],
                          pending["model"], pending["optimizer"], pending["scheduler"],
                          data_position=pending["step"],
                          extras={TRAINER_STATE_KEY: saved})

    # ----------------------------------------------------------------- DDP
    def _install_bucket_fix(self, model: Any) -> None:
        self._remove_hook()
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return

        def first_forward(module: Any, inputs: Any) -> None:
            if not torch.is_grad_enabled():
                return  # an evaluation (eval_on_start): DDP rebuilds only when training
            # The outermost module's hook runs first: the Trainer's wrapper, or the model
            # itself when nothing wraps it (FSDP, DeepSpeed: no DDP buckets to fix).
            self._remove_hook()
            if isinstance(module, DistributedDataParallel) and module.module is model:
                fix_buckets(module)

        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(first_forward)

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
