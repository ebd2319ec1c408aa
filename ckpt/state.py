"""Build a rank's checkpoint state from training objects, and apply one back.

The state is a plain nested dict whose tensors are the live ones (no copy): the
snapshot copies them in the background, which is why training calls
``CheckpointManager.wait()`` before the optimizer mutates them. Forward passes may
mutate module buffers (BatchNorm running statistics), so those are cloned here.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and (if initialised) every CUDA device's RNG state."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def capture_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                  scheduler: Any = None, data_position: Any = None,
                  extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """The state to pass to ``CheckpointManager.snapshot`` after the optimizer step.

    Args:
        model: its ``state_dict()`` (parameters by reference, buffers cloned).
        optimizer: its ``state_dict()`` (by reference), or None.
        scheduler: anything with ``state_dict()`` (an LR scheduler), or None.
        data_position: where the data loader resumes (any picklable value or a
            ``state_dict()`` of a stateful loader).
        extras: user values (picklable, or tensors) restored verbatim.
    """
    buffers = {name for name, _ in model.named_buffers()}
    model_state = model.state_dict()
    for name in buffers & model_state.keys():
        model_state[name] = model_state[name].detach().clone()
    return {
        "model": model_state,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(),
        "data_position": data_position,
        "extras": dict(extras or {}),
    }


def apply_state(state: dict[str, Any], model: torch.nn.Module,
                optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                restore_rng: bool = True) -> Any:
    """Load a restored state into the training objects; return its data position.

    Raises whatever ``load_state_dict`` raises when the state does not fit the model
    (a checkpoint of another model is an error, not something to skip).
    """
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state.get("data_position")
