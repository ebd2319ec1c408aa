"""Worker entry for RobustExecutor.submit: run a pickled function on this rank.

``python -m slurm_robust.launcher.node.fnworker RUN_DIR/function.pkl``: every rank calls
``fn(*args, **kwargs)`` with the torchrun-style environment set by its agent (the
function uses :mod:`slurm_robust.train` or plain torch.distributed); rank 0 writes its
return value to ``RUN_DIR/result.pkl`` (atomically) for ``RobustJob.result()``.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from slurm_robust.records import write_bytes_atomic
from slurm_robust.run_dir_trust import check_run_dir, read_trusted_bytes


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0])
    # Unpickling runs code: only a pickle of ours in a run directory no one else writes.
    check_run_dir(path.parent)
    fn, fargs, fkwargs = pickle.loads(read_trusted_bytes(path))
    result = fn(*fargs, **fkwargs)
    if os.environ.get("RANK", "0") == "0":
        out = path.with_name("result.pkl")
        write_bytes_atomic(out, [pickle.dumps(result)], 0o600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
