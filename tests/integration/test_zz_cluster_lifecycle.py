"""`cluster down` stops exactly what `up` started; `up` brings it all back.

Named to run after the other integration tests: it restarts the shared cluster.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from slurm_robust_rehearsal.cluster.daemons import our_processes
from slurm_robust_rehearsal.cluster.manager import MiniCluster

pytestmark = pytest.mark.integration


def test_down_leaves_nothing_and_up_restores(minicluster):
    mc = MiniCluster(minicluster.cfg)
    # A process that is not ours, to check that down does not touch it.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    job_id = minicluster.slurm.sbatch(["-N", "1", "-o", "/dev/null"],
                                      script="#!/bin/sh\nsleep 300\n")
    try:
        deadline = time.monotonic() + 30
        while not minicluster.slurm.job(job_id).running and time.monotonic() < deadline:
            time.sleep(0.3)
        survivors = mc.down()
        assert survivors == []
        assert our_processes(mc.cfg.root) == []
        assert not any(mc.running().values())
        assert bystander.poll() is None
    finally:
        bystander.kill()
        rep = mc.up()
    assert set(rep.started) == {d.name for d in mc.daemons()}
    assert all(n.usable for n in minicluster.slurm.nodes())
