"""No ``torch.load`` in the package, the checkpoint library, the examples or the tests
unpickles arbitrary objects: a ``.pt`` file at a path a user chose (a work directory,
a checkpoint directory, a run directory others can write to) would otherwise run code
in whoever loads it. Results that are not tensors are plain containers of numbers and
strings, which ``weights_only=True`` loads."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
TREES = ("slurm_robust", "ckpt", "examples", "analysis", "prolog", "epilog", "tests")


def _torch_loads(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "torch"]


def test_every_torch_load_is_weights_only():
    unsafe = []
    for top in TREES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for call in _torch_loads(ast.parse(path.read_text(), str(path))):
                kw = {k.arg: k.value for k in call.keywords}
                value = kw.get("weights_only")
                if not (isinstance(value, ast.Constant) and value.value is True):
                    unsafe.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert unsafe == [], f"torch.load without weights_only=True: {unsafe}"


def test_the_gpt_examples_checkpoint_loads_weights_only(tmp_path):
    """What examples/train_gpt.py saves (model, AdamW, LambdaLR with a lambda, step)."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(s)))
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    sched.step()
    torch.save({"step": 3, "model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    assert state["step"] == 3
