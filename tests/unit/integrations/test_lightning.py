"""The Lightning callback, run for real (CPU, one process): a fit that crashes mid-epoch
or right after an epoch's last step and is fitted again resumes from the callback's last
snapshot and ends bit-identical to an uninterrupted fit; the progress channel has every
step and the restore. The resumable loader is examples/train_lightning.py's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

pl = pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed "
                         "(optional extra: pip install 'slurm-robust[lightning]')")

from slurm_robust.integrations.lightning import RobustCallback  # noqa: E402
from tests.unit.integrations.launcher_env import lines, robust_env  # noqa: E402

# 64 samples / batch 4: 16 steps an epoch. Step 6 is mid-epoch 0; step 16 ends it.
STEPS, BATCH = 20, 4
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_lightning.py"


def _example_loader() -> type[DataLoader]:
    """The resumable loader of examples/train_lightning.py (what a user copies)."""
    spec = importlib.util.spec_from_file_location("train_lightning_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ResumableLoader


ResumableLoader = _example_loader()


class Regression(pl.LightningModule):
    def __init__(self, crash_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))
        self.crash_at = crash_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.crash_at:
            raise RuntimeError(f"deliberate crash at step {self.crash_at}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit(crash_at: int | None = None) -> Regression:
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    model = Regression(crash_at)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[RobustCallback()])
    # A shuffle that changes with the epoch (Lightning calls set_epoch): a restore that
    # skipped or repeated an epoch would see other batches.
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    trainer.fit(model, ResumableLoader(data, batch_size=BATCH, sampler=sampler))
    return model


@pytest.mark.parametrize("crash_at", [6, 16], ids=["mid-epoch", "epoch-end"])
def test_a_crashed_fit_resumes_bit_identical(monkeypatch, tmp_path, crash_at):
    """Crashed in the step after ``crash_at``: the restore is of step ``crash_at``, mid
    epoch 0 or its last batch (where Lightning goes on with epoch 1, and a loader whose
    state still counted epoch 0's batches skipped epoch 1 whole)."""
    robust_env(monkeypatch, tmp_path, "clean")
    clean = fit()

    progress = robust_env(monkeypatch, tmp_path, "crash")
    with pytest.raises(RuntimeError, match="deliberate crash"):
        fit(crash_at=crash_at)
    resumed = fit()

    for name, tensor in clean.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    items = lines(progress)
    steps = [i["step"] for i in items if i["kind"] == "step"]
    # First fit: steps 1..crash_at; the second restores crash_at and goes on from there.
    assert steps == [*range(1, crash_at + 1), *range(crash_at + 1, STEPS + 1)], steps
    restored = [i for i in items if i["kind"] == "restored"]
    assert [r["step"] for r in restored] == [None, crash_at]
    assert all(isinstance(i["loss"], float) for i in items if i["kind"] == "step")
    final = [i for i in items if i["kind"] == "final"]
    assert final[-1]["step"] == STEPS and final[-1]["params_sha256"]


def test_the_callback_is_a_no_op_without_the_launcher(monkeypatch):
    for var in ("SLURM_ROBUST_PROGRESS", "SLURM_ROBUST_CKPT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert fit().global_step == STEPS


class Validated(Regression):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))


def test_validation_and_saves_are_reported_as_phases(monkeypatch, tmp_path):
    """Validation every 4 batches and a checkpoint after each: the progress channel has
    the eval phase around every validation and the save phase until the next batch."""
    progress = robust_env(monkeypatch, tmp_path, "phases")
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    saves = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), save_top_k=-1,
                                         every_n_train_steps=4)
    trainer = pl.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, val_check_interval=4,
                         callbacks=[RobustCallback(), saves])
    trainer.fit(Validated(), DataLoader(data, batch_size=BATCH),
                DataLoader(data, batch_size=BATCH))
    items = [i for i in lines(progress) if i["kind"] in ("phase", "step")]
    seq = [i["phase"] if i["kind"] == "phase" else i["step"] for i in items]
    assert seq[:4] == [1, 2, 3, 4]
    assert "eval" in seq and "save" in seq, seq
    # Every phase entered is left: the rank is back in steps before the next step.
    for k, item in enumerate(seq):
        if item in ("eval", "save"):
            rest = seq[k + 1:]
            nxt = next((x for x in rest if isinstance(x, int)), None)
            assert nxt is None or "steps" in rest[:rest.index(nxt)], seq
