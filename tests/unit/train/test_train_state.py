"""The training API carries any state: extras, a data position of any type, Stateful."""

from __future__ import annotations

import json

import pytest
import torch

from slurm_robust import train


class Loader:
    """A stateful loader: a cursor and a prefetched batch (not an int position)."""

    def __init__(self) -> None:
        self.cursor = {"epoch": 0, "index": 0, "prefetched": [1, 2, 3]}

    def state_dict(self) -> dict:
        return self.cursor

    def load_state_dict(self, state: dict) -> None:
        self.cursor = dict(state)


@pytest.fixture
def robust_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_ROBUST_PROGRESS", str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv("SLURM_ROBUST_CKPT", json.dumps({
        "shm_root": str(tmp_path / "shm"), "local_root": None, "durable_root": None,
        "local_every": 0, "durable_every": 0, "peer_backup": False}))
    monkeypatch.setenv("SLURM_ROBUST_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ROBUST_NODE", "n1")
    for var in ("RANK", "WORLD_SIZE", "SLURM_ROBUST_RUN_DIR"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_extras_position_and_stateful_survive_a_restart(robust_env):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = train.init(backend="gloo")
    loader = Loader()
    run.register_stateful("loader", loader)
    assert run.restore(model, opt) == 0 and run.data_position is None and run.extras == {}
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    loader.cursor["index"] = 5
    position = {"shard": "b", "offset": 17}
    run.step_end(1, 0.5, None, model, opt, data_position=position,
                 extras={"tokens_seen": 4096, "best": [0.5, "x"]})
    loader.cursor["index"] = 6  # after the snapshot: must not leak into it
    run.finish()
    weights = model.weight.detach().clone()

    model2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    run2 = train.init(backend="gloo")
    loader2 = Loader()
    run2.register_stateful("loader", loader2)
    assert run2.restore(model2, opt2) == 1  # the position is not an int: the step
    assert run2.data_position == position
    assert run2.extras == {"tokens_seen": 4096, "best": [0.5, "x"]}
    assert loader2.cursor == {"epoch": 0, "index": 5, "prefetched": [1, 2, 3]}
    assert torch.equal(model2.weight, weights)
    run2.finish()


def test_register_rejects_objects_without_state_dict(robust_env):
    run = train.init(backend="gloo")
    with pytest.raises(TypeError, match="state_dict"):
        run.register_stateful("x", object())


def test_the_spike_baseline_survives_a_restart(robust_env):
    """A restored worker tests the steps it replays against the values before the
    snapshot: a spike the data causes comes back at its own step (then the ladder's
    same-place rule stops the run) instead of passing unseen for the first steps."""
    model = torch.nn.Linear(3, 2)
    run = train.init(backend="gloo")
    assert run.restore(model) == 0
    for step in range(1, 11):
        run.step_end(step, 2.0, 1.0, model, data_position=step)
    run.finish()

    run2 = train.init(backend="gloo")
    assert run2.restore(torch.nn.Linear(3, 2)) == 10
    assert run2.extras == {}  # the sentinel's values are not the caller's extras
    aborted = []
    run2._abort = lambda anomaly, name, step, value: aborted.append((anomaly, name, step))
    run2.step_end(11, 2.0, 6.0, model, data_position=11)  # 6x the grad norm's median
    assert aborted == [("loss_spike", "grad_norm", 11)]
    run2.finish()
