"""slurmd's HealthCheckProgram (``epilog/health_check.py``): one ``sinfo`` call, and the
deep check (slurm_robust.node_deep_check) only on a node that waits for it.

slurmd runs the program as root on every node every ``HealthCheckInterval``, drained or
not, and almost every run finds nothing to do. So this module imports only what that
answer needs; the deep suite, the repair loop and the node ledger are imported when the
node is pending (importing them up front was half the CPU of every run: ~0.12 s against
~0.06 s, measured with ``python -I -c 'import ...'``).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from typing import TextIO

from slurm_robust.errors import SlurmRobustError
from slurm_robust.pending_reason import is_pending
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import Slurm, check_node_name


def main(environ: Mapping[str, str], err: TextIO = sys.stderr,
         detach: bool = True) -> int:
    """Deep-check this node if it is pending. Always 0: a failure here is reported, never
    a reason for slurmd to mark the node down."""
    try:
        node = check_node_name(environ.get("SLURMD_NODENAME")
                               or socket.gethostname().split(".")[0])
        site = load_site_config()
        slurm = Slurm()
        state, reason = slurm.node_state_reason(node)
    except (SlurmRobustError, OSError) as exc:
        print(f"slurm_robust health_check: {exc}", file=err)
        return 0
    if not is_pending(state, reason):
        return 0  # the common case: one sinfo call, nothing else
    from slurm_robust.node_deep_check import run_pending

    return run_pending(node, site, slurm, err, detach)
