"""`slurm-robust submit` refuses at once an allocation its partition can never satisfy."""

from __future__ import annotations

import subprocess
import sys
import time


def test_submit_refuses_more_nodes_than_the_partition_has(minicluster):
    jobs_before = {j.job_id for j in minicluster.slurm.jobs()}
    run_dir = minicluster.cfg.shared_dir / f"test-capacity-{int(time.time() * 1000)}"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "slurm_robust.cli.main", "submit",
                          "--nodes", "4", "--spares", "1", "--folder", str(run_dir), "--",
                          sys.executable, "-c", "pass"],
                         env=minicluster.env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "5 nodes" in lines[0] and "'train' has 4 nodes" in lines[0]
    assert time.monotonic() - t0 < 30  # refused, not left pending
    # Nothing was submitted.
    assert {j.job_id for j in minicluster.slurm.jobs()} == jobs_before
    ok = subprocess.run([sys.executable, "-m", "slurm_robust.cli.main", "submit",
                         "--nodes", "4", "--spares", "1", "--partition", "standby",
                         "--folder", str(run_dir), "--", sys.executable, "-c", "pass"],
                        env=minicluster.env, capture_output=True, text=True, timeout=60)
    assert ok.returncode != 0 and "'standby'" in ok.stderr
