#!/usr/bin/env python3
"""Slurm node Prolog: the quick self-check suite (see slurm_robust.node_program).

Exit 0: the node is healthy, the job starts. Non-zero: the node was drained with the
failing check's reason and Slurm requeues the job.
"""

import os
import sys

from slurm_robust.node_program import main

if __name__ == "__main__":
    sys.exit(main("prolog", os.environ))
