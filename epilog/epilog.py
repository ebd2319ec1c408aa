#!/usr/bin/env python3
"""Slurm node Epilog: the deep self-check suite (see slurm_robust.node_program).

Exit 0: the node is healthy, the node takes the next job. Non-zero: the node was
drained with the failing check's reason.
"""

import os
import sys

from slurm_robust.node_program import main

if __name__ == "__main__":
    sys.exit(main("epilog", os.environ))
