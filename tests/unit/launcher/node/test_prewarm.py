"""The fork server's default pre-imports cover what a training script's start imports lazily.

Building the first optimizer imports torch._dynamo (sympy included): 0.8-2 s on this
machine, which was most of an in-place restart until it was pre-imported. If a
torch upgrade moves that lazy import elsewhere, this test names the new modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

from slurm_robust.launcher.config import RunConfig

PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
before = set(sys.modules)
import torch
from torch import nn
model = nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
model(torch.zeros(2, 4)).sum().backward()
opt.step()
sched.step()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_an_optimizer_step_imports_nothing_heavy_after_the_prewarm() -> None:
    prewarm = RunConfig.__dataclass_fields__["prewarm"].default
    out = subprocess.run([sys.executable, "-c", PROBE, *prewarm], capture_output=True,
                         text=True, timeout=120, check=True)
    new = json.loads(out.stdout)
    heavy = [m for m in new if m.split(".")[0] in ("sympy", "mpmath")
             or m.startswith(("torch._dynamo", "torch._inductor"))]
    assert heavy == [], f"imported after the prewarm {prewarm}: {heavy[:10]}"
    assert len(new) < 50, new
