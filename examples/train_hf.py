"""A Hugging Face ``Trainer`` run with slurm_robust's callback: one line in the Trainer.

    torchrun --nnodes 3 --nproc-per-node 1 ... examples/train_hf.py   # plain transformers
    slurm-robust submit --nodes 3 --spares 1 -- python examples/train_hf.py

A tiny GPT-2 built from its config (no download, no tokenizer) learns synthetic token
sequences on the CPU (gloo). The model, the dataset, ``TrainingArguments`` and the
Trainer are written as a transformers user writes them; the robust part is
``callbacks=[RobustCallback()]`` (outside the launcher it does nothing). Under the
launcher every step is snapshotted in memory (with a peer backup and the disk tiers),
reported with its loss and grad norm for hang, NaN and fail-slow detection, and a
restarted worker resumes from the newest snapshot: parameters, AdamW and LR scheduler
state, RNG, the Trainer's step and epoch, and the data position mid-epoch.

GPT-2 ties its output layer to the token embedding, so that weight's gradient becomes
ready last although it is declared first: with ``ddp_find_unused_parameters=False``, the
case where DDP's bucket rebuild would change a restarted process (the callback fixes
the layout). The world comes from
torchrun's variables, which the launcher sets too. Rank 0 prints ``params_sha256=`` at
the end: a run with faults ends with the same digest as one without.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
import transformers
from transformers.trainer_callback import PrinterCallback

from slurm_robust import train
from slurm_robust.integrations.hf import RobustCallback

VOCAB, LENGTH = 64, 16


class Sequences(torch.utils.data.Dataset):
    """Arithmetic token sequences (start and stride drawn once from ``seed``), with a
    little noise: a next-token problem a tiny model learns in a few dozen steps."""

    def __init__(self, samples: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (samples, 1), generator=g)
        stride = torch.randint(1, 5, (samples, 1), generator=g)
        ids = (start + stride * torch.arange(LENGTH)) % VOCAB
        noise = torch.rand(samples, LENGTH, generator=g) < 0.05
        self.ids = torch.where(noise, torch.randint(0, VOCAB, ids.shape, generator=g), ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class MinStepTime(transformers.TrainerCallback):
    """A stand-in for a real model's step time (faults are injected mid-run)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.started = seconds, 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.started)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8, help="per rank")
    p.add_argument("--samples", type=int, default=288)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-step-time", type=float, default=0.0)
    p.add_argument("--threads", type=int, default=None,
                   help="torch's intra-op threads (default: torch's own choice). The bits "
                        "of a reduction depend on it: runs compared digest to digest must "
                        "use the same count")
    p.add_argument("--output-dir", default=None,
                   help="the Trainer's output_dir (default: a temporary directory)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32,
                                     n_layer=2, n_head=2)
    torch.manual_seed(args.seed)
    model = transformers.GPT2LMHeadModel(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    with tempfile.TemporaryDirectory() as scratch:
        targs = transformers.TrainingArguments(
            output_dir=args.output_dir or scratch, max_steps=args.steps,
            per_device_train_batch_size=args.batch, learning_rate=3e-3, weight_decay=0.01,
            lr_scheduler_type="cosine", warmup_steps=5, logging_steps=1,
            save_strategy="no", report_to=[], use_cpu=True, seed=args.seed,
            ddp_backend="gloo" if world > 1 else None, dataloader_num_workers=0,
            # The Trainer's default for a PreTrainedModel is True, which costs a graph
            # traversal every step; every parameter here gets a gradient.
            ddp_find_unused_parameters=False, disable_tqdm=True)
        trainer = transformers.Trainer(
            model=model, args=targs, train_dataset=Sequences(args.samples, args.seed + 1),
            callbacks=[RobustCallback(), MinStepTime(args.min_step_time)])
        trainer.remove_callback(PrinterCallback)  # one log dict a step on stdout
        trainer.train()
    if trainer.is_world_process_zero():
        print(f"params_sha256={train.params_digest(model)} step={trainer.state.global_step}",
              flush=True)


if __name__ == "__main__":
    main()
