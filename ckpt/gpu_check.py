"""``python -m slurm_robust.ckpt.gpu_check``: the prepared GPU check of the checkpoint path.

The check itself lives with the rehearsal tooling (rehearsal/slurm_robust_rehearsal/bench/ckpt_gpu.py,
it needs the example model); this name is kept because runbooks and the first session
with a lent GPU call it. It is run by name, so the checkpoint package imports nothing of
the rehearsal tooling.
"""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("slurm_robust_rehearsal.bench.ckpt_gpu", run_name="__main__",
                     alter_sys=True)
