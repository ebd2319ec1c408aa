#!/usr/bin/env python3
"""slurmd HealthCheckProgram: deep-check this node when it is drained "pending deep check"
and return it to service if it passes (see slurm_robust.health_check_program and
slurm_robust.node_deep_check). Always exits 0.
"""

import os
import sys

from slurm_robust.health_check_program import main

if __name__ == "__main__":
    sys.exit(main(os.environ))
