"""The Lightning callback, run for real (CPU, one process): a fit that crashes mid-epoch
and is fitted again resumes from the callback's last snapshot and ends bit-identical to
an uninterrupted fit; the progress channel has every step and the restore."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning", reason="PyTorch Lightning is not installed "
                         "(optional extra: pip install 'slurm-robust[lightning]')")

from slurm_robust.integrations.lightning import RobustCallback  # noqa: E402
from tests.unit.integrations.launcher_env import lines, robust_env  # noqa: E402

STEPS, CRASH_AT, BATCH = 10, 6, 4


class ResumableLoader(DataLoader):
    """A dataloader Lightning can resume mid-epoch (its ``state_dict`` interface): it
    counts the batches it handed out and skips them on the next iteration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served, self.skip = 0, 0

    def __iter__(self):  # type: ignore[override]
        it = super().__iter__()
        for _ in range(self.skip):
            next(it)
        self.served, self.skip = self.skip, 0
        for batch in it:
            self.served += 1
            yield batch
        self.served = 0  # an epoch ended: the next starts from its first batch

    def state_dict(self) -> dict[str, int]:
        return {"served": self.served}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = state["served"]


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
    trainer.fit(model, ResumableLoader(data, batch_size=BATCH))  # 16 batches an epoch
    return model


def test_a_crashed_fit_resumes_bit_identical(monkeypatch, tmp_path):
    robust_env(monkeypatch, tmp_path, "clean")
    clean = fit()

    progress = robust_env(monkeypatch, tmp_path, "crash")
    with pytest.raises(RuntimeError, match="deliberate crash"):
        fit(crash_at=CRASH_AT)
    resumed = fit()

    for name, tensor in clean.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    items = lines(progress)
    steps = [i["step"] for i in items if i["kind"] == "step"]
    # First fit: steps 1..CRASH_AT; the second restores CRASH_AT and goes on from there.
    assert steps == [*range(1, CRASH_AT + 1), *range(CRASH_AT + 1, STEPS + 1)], steps
    restored = [i for i in items if i["kind"] == "restored"]
    assert [r["step"] for r in restored] == [None, CRASH_AT]
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
