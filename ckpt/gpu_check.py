"""``python -m slurm_robust.ckpt.gpu_check``: the prepared GPU check of the checkpoint path.

The check itself lives with the rehearsal tooling
(rehearsal/slurm_robust_rehearsal/bench/ckpt_gpu.py, it needs the example model), a
distribution of its own; this name is kept because runbooks and the first session with a
lent GPU call it. It is run by name, so the checkpoint package imports nothing of the
rehearsal tooling; where that is not installed, it says in one line how to install it.
"""

from __future__ import annotations

import runpy
import sys

CHECK = "slurm_robust_rehearsal.bench.ckpt_gpu"

if __name__ == "__main__":
    from slurm_robust.tooling import REHEARSAL_MISSING, rehearsal_installed

    if not rehearsal_installed():
        print(f"python -m slurm_robust.ckpt.gpu_check: {REHEARSAL_MISSING}", file=sys.stderr)
        sys.exit(2)
    runpy.run_module(CHECK, run_name="__main__", alter_sys=True)
