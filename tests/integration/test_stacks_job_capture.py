"""``slurm-robust stacks capture --job J``: capture through ``srun --overlap`` on the
nodes of a real running job of the mini-cluster, then analysis of what came back."""

from __future__ import annotations

import json
import sys
import time

import pytest

from slurm_robust.cli.main import main

pytestmark = pytest.mark.integration

# One "worker" per task: it publishes (rank, node, pid) and waits; rank 3 waits elsewhere.
WORKER = """
import json, os, sys, time
from pathlib import Path
def waiting_in_collective():
    time.sleep(300)
def stuck_outside():
    time.sleep(300)
rank, node = int(os.environ["SLURM_PROCID"]), os.environ["SLURMD_NODENAME"]
pids = Path(sys.argv[1])
(pids / f"{rank}.tmp").write_text(json.dumps([rank, node, os.getpid()]))
(pids / f"{rank}.tmp").rename(pids / f"{rank}.json")
(stuck_outside if rank == 3 else waiting_in_collective)()
"""


def _wait(what, probe, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_capture_by_job_id_through_srun_names_the_stuck_rank(minicluster, tmp_path,
                                                             monkeypatch, capsys):
    s = minicluster.slurm
    base = minicluster.cfg.shared_dir / "tests" / "stacks_job_capture" / str(time.time_ns())
    run, pids = base / "run", base / "pids"
    pids.mkdir(parents=True)
    (base / "worker.py").write_text(WORKER)
    script = (f"#!/bin/sh\nsrun -N2 --ntasks-per-node=2 {sys.executable} "
              f"{base / 'worker.py'} {pids}\n")
    job_id = s.sbatch(["-N", "2", "-n", "4", "-p", "train", "-t", "5",
                       "-o", str(base / "%j.out")], script=script)
    try:
        found = _wait("4 workers", lambda: len(list(pids.glob("*.json"))) == 4 and
                      [json.loads(p.read_text()) for p in pids.glob("*.json")])
        # Play the agents' part: <run_dir>/agents/<node>.json with {rank: pid}.
        agents: dict[str, dict[str, int]] = {}
        for rank, node, pid in found:
            agents.setdefault(node, {})[str(rank)] = pid
        (run / "agents").mkdir(parents=True)
        for node, workers in agents.items():
            (run / "agents" / f"{node}.json").write_text(
                json.dumps({"node": node, "workers": workers}))
        time.sleep(0.5)
        for key, value in minicluster.cfg.env().items():
            monkeypatch.setenv(key, value)
        assert main(["stacks", "capture", "--job", str(job_id), "--run-dir", str(run),
                     "--srun", "--capture-id", "c1", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert {n["how"] for n in report["nodes"]} == {"srun"}
        assert all(n["error"] is None for n in report["nodes"]), report
        assert main(["stacks", "analyze", str(run / "stacks" / "c1"), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        node_of_3 = next(node for rank, node, _ in found if rank == 3)
        assert result["verdict"] == "evict", result
        assert result["outlier_ranks"] == [3]
        assert result["nodes"] == [node_of_3]
    finally:
        s.cancel(job_id)
