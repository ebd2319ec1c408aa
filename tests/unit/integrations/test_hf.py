"""The transformers Trainer callback, run for real (CPU, one process): a training run that
crashes and is started again resumes from the callback's last snapshot and ends
bit-identical to an uninterrupted one, whether the crash falls mid-epoch (the restore
skips one epoch whole and part of the next) or on an epoch boundary; the model uses
dropout, so the RNG must be where the uninterrupted run had it. The progress channel
has every step with its loss, and the restore."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed "
                    "(optional extra: pip install 'slurm-robust[hf]')")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate "
                    "(optional extra: pip install 'slurm-robust[hf]')")

import transformers  # noqa: E402

from slurm_robust.integrations.hf import RobustCallback  # noqa: E402
from tests.unit.integrations.launcher_env import lines, robust_env

# 32 samples / batch 4: 8 steps an epoch. Step 12 is batch 4 of epoch 1; step 8 ends epoch 0.
STEPS, BATCH, SAMPLES = 20, 4, 32


class Pairs(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(SAMPLES, 8, generator=g)
        self.y = torch.randn(SAMPLES, 1, generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Regression(torch.nn.Module):
    """Raises in the first forward of step ``crash_at + 1`` (a worker dying mid-step);
    ``accum``: micro-batches a step."""

    def __init__(self, crash_at: int | None = None, accum: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
        self.crash_at, self.accum, self.calls = crash_at, accum, 0

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at * self.accum + 1:
            raise RuntimeError(f"deliberate crash after step {self.crash_at}")
        return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}


def fit(tmp_path: Any, crash_at: int | None = None,
        callback: RobustCallback | None = None, robust: bool = True,
        accum: int = 1, steps: int = STEPS) -> Regression:
    model = Regression(crash_at, accum)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accum,
        learning_rate=1e-2, lr_scheduler_type="linear", warmup_steps=3, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=0)
    callbacks = [callback or RobustCallback()] if robust else []
    transformers.Trainer(model=model, args=args, train_dataset=Pairs(),
                         callbacks=callbacks).train()
    return model


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name


@pytest.fixture(scope="module")
def clean_state(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The uninterrupted run under the same (single-rank) launcher environment."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("clean")
    try:
        robust_env(mp, tmp, "clean")
        return fit(tmp).state_dict()
    finally:
        mp.undo()


@pytest.mark.parametrize("crash_at", [12, 8], ids=["mid-epoch", "epoch-boundary"])
def test_a_crashed_run_resumes_bit_identical(monkeypatch, tmp_path, clean_state, crash_at):
    progress = robust_env(monkeypatch, tmp_path, f"crash-{crash_at}")
    crashed = RobustCallback()
    with pytest.raises(RuntimeError, match="deliberate crash"):
        fit(tmp_path, crash_at=crash_at, callback=crashed)
    # A worker's uncaught exception lets the snapshots already taken complete
    # (train.init's excepthook); here pytest catches it, so do what the hook does.
    crashed.run._mgr.flush(timeout=10.0)
    resumed = fit(tmp_path)

    for name, tensor in clean_state.items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    items = lines(progress)
    steps = [i["step"] for i in items if i["kind"] == "step"]
    # First run: steps 1..crash_at; the second restores crash_at and goes on from there.
    assert steps == [*range(1, crash_at + 1), *range(crash_at + 1, STEPS + 1)], steps
    restored = [i for i in items if i["kind"] == "restored"]
    assert [r["step"] for r in restored] == [None, crash_at]
    reported = [i for i in items if i["kind"] == "step"]
    assert all(isinstance(i["loss"], float) and isinstance(i["grad_norm"], float)
               for i in reported), reported
    final = [i for i in items if i["kind"] == "final"]
    assert final[-1]["step"] == STEPS and final[-1]["params_sha256"]


def test_gradient_accumulation_resumes_bit_identical(monkeypatch, tmp_path):
    """Two micro-batches a step: 4 steps an epoch; step 6 is 4 batches into epoch 1."""
    robust_env(monkeypatch, tmp_path, "clean-accum")
    clean = fit(tmp_path, accum=2, steps=10)
    progress = robust_env(monkeypatch, tmp_path, "crash-accum")
    crashed = RobustCallback()
    with pytest.raises(RuntimeError, match="deliberate crash"):
        fit(tmp_path, crash_at=6, callback=crashed, accum=2, steps=10)
    crashed.run._mgr.flush(timeout=10.0)
    assert_same_params(clean, fit(tmp_path, accum=2, steps=10))
    steps = [i["step"] for i in lines(progress) if i["kind"] == "step"]
    assert steps == list(range(1, 11)), steps


def test_the_first_loss_after_a_restore_is_the_steps_own(monkeypatch, tmp_path, clean_state):
    """The Trainer divides the first logged loss by the steps since its own start; the
    callback reports the restored run's loss at step k+1 as the uninterrupted run's."""
    clean_progress = robust_env(monkeypatch, tmp_path, "clean-loss")
    fit(tmp_path)
    clean = {i["step"]: i["loss"] for i in lines(clean_progress) if i["kind"] == "step"}
    progress = robust_env(monkeypatch, tmp_path, "crash-loss")
    crashed = RobustCallback()
    with pytest.raises(RuntimeError, match="deliberate crash"):
        fit(tmp_path, crash_at=12, callback=crashed)
    crashed.run._mgr.flush(timeout=10.0)
    fit(tmp_path)
    resumed = [i for i in lines(progress) if i["kind"] == "step" and i["step"] > 12]
    assert resumed[0]["loss"] == pytest.approx(clean[13], rel=1e-6), (resumed[0], clean[13])


def test_the_callback_is_a_no_op_without_the_launcher(monkeypatch, tmp_path, clean_state):
    for var in ("SLURM_ROBUST_PROGRESS", "SLURM_ROBUST_CKPT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with_callback = fit(tmp_path)
    assert_same_params(with_callback, fit(tmp_path, robust=False))
    # And the same training as under the launcher: the callback changes no step.
    for name, tensor in clean_state.items():
        assert torch.equal(tensor, with_callback.state_dict()[name]), name


def test_evaluation_and_saves_are_reported_as_phases(monkeypatch, tmp_path):
    """Evaluation every 5 steps, a save every 10: the progress channel has the eval phase
    around each evaluation and the save phase around each save, back to steps after."""
    progress = robust_env(monkeypatch, tmp_path, "phases")
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=10, per_device_train_batch_size=BATCH,
        logging_steps=1, eval_strategy="steps", eval_steps=5, save_strategy="steps",
        save_steps=10, report_to=[], use_cpu=True, seed=0,
        disable_tqdm=True, dataloader_num_workers=0)
    transformers.Trainer(model=Regression(), args=args, train_dataset=Pairs(),
                         eval_dataset=Pairs(), callbacks=[RobustCallback()]).train()
    seq = [i["phase"] if i["kind"] == "phase" else i["step"] for i in lines(progress)
           if i["kind"] in ("phase", "step")]
    # A step is reported at the next step's begin (after its evaluation and save); the
    # Trainer is back in its own code between the evaluation and the save.
    assert seq == [1, 2, 3, 4, "eval", "steps", 5, 6, 7, 8, 9, "eval", "steps", "save",
                   "steps", 10], seq
