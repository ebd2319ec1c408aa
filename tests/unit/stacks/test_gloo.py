"""The real thing: 8 CPU processes in a gloo group, one rank blocked outside the
all-reduce while the others wait inside it; capture and analysis must name it.

The 8 ranks are treated as 4 nodes of 2 ranks (each "node" captured on its own, as each
agent does). Each test starts 8 torch processes: about 10-15 s on 2 cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_robust.layout import parse_layout
from slurm_robust.stacks.analyze import analyze, explain
from slurm_robust.stacks.capture import CaptureOptions, capture_local
from slurm_robust.stacks.dumps import read_capture

pytestmark = pytest.mark.slow

WORLD = 8
RANKS_PER_NODE = 2


def _node(rank: int) -> str:
    return f"n{rank // RANKS_PER_NODE}"


@pytest.fixture
def gloo_job(tmp_path):
    procs: list[subprocess.Popen] = []

    def start(hang_rank: int, hang_in: str, template: str = "") -> dict[int, int]:
        ready = tmp_path / "ready"
        ready.mkdir()
        for rank in range(WORLD):
            argv = [sys.executable, "-m", "slurm_robust_rehearsal.workloads.stacks_gloo",
                    "--rank", str(rank),
                    "--world", str(WORLD), "--store", str(tmp_path / "store"),
                    "--ready-dir", str(ready), "--hang-rank", str(hang_rank),
                    "--hang-in", hang_in, "--max-seconds", "90"]
            if template:
                argv += ["--faulthandler", template]
            procs.append(subprocess.Popen(argv, start_new_session=True))
        deadline = time.monotonic() + 80
        while len(list(ready.glob("rank*"))) < WORLD:
            assert all(p.poll() is None for p in procs), "a rank died while starting"
            assert time.monotonic() < deadline, "ranks did not reach the hang step"
            time.sleep(0.1)
        return {rank: p.pid for rank, p in enumerate(procs)}

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the rank and its data-loader worker
        except ProcessLookupError:
            pass
        proc.wait()


def _capture_and_analyze(pids: dict[int, int], out: Path, layouts: list[str],
                         options: CaptureOptions | None = None):
    """Capture per node, then analyze under each layout; retried while the healthy
    ranks are still on their way into the all-reduce."""
    for attempt in range(5):
        time.sleep(1.0)
        directory = out / f"try{attempt}"
        for node in sorted({_node(r) for r in pids}):
            mine = {r: p for r, p in pids.items() if _node(r) == node}
            capture_local(mine, node, directory, options, capture_id=f"try{attempt}")
        dumps = read_capture(directory)
        results = [analyze(dumps, parse_layout(text, ranks_per_node=RANKS_PER_NODE))
                   for text in layouts]
        if all(r.verdict == "evict" for r in results):
            return dumps, results
    pytest.fail("no eviction after 5 captures:\n" + "\n".join(explain(r) for r in results))


def test_rank_blocked_in_main_process_is_named(gloo_job, tmp_path):
    pids = gloo_job(hang_rank=3, hang_in="main")
    dumps, (pp, dp) = _capture_and_analyze(pids, tmp_path / "stacks",
                                           ["tp=1,pp=2,dp=4", "dp=8"])
    assert all(p.error is None for d in dumps for p in d.processes if p.role == "worker")
    assert any(p.role == "child" for d in dumps for p in d.processes)  # data loaders
    assert pp.outlier_ranks == [3], explain(pp)
    assert pp.eviction.dim == "pp" and pp.eviction.groups == ((3, 7),)
    assert pp.nodes == ["n1", "n3"]
    assert dp.outlier_ranks == [3] and dp.nodes == ["n1"]
    healthy = next(g for g in pp.groups if g.healthy)
    assert healthy.size == 7
    assert any("all_reduce" in f for f in healthy.example[0]["frames"])


def test_rank_blocked_in_data_loader_child_is_named_via_faulthandler(gloo_job, tmp_path):
    template = str(tmp_path / "fh" / "{node}-{pid}.txt")
    pids = gloo_job(hang_rank=6, hang_in="loader", template=template)
    options = CaptureOptions(method="faulthandler", faulthandler_template=template)
    dumps, (layered, dp) = _capture_and_analyze(pids, tmp_path / "stacks",
                                                ["tp=2,pp=2,dp=2", "dp=8"], options)
    assert all(p.method == "faulthandler" for d in dumps for p in d.processes)
    stuck = next(d for d in dumps if d.rank == 6)
    child_frames = [f.name for p in stuck.processes if p.role == "child"
                    for t in p.threads for f in t.frames]
    assert "_sleep_forever_in_loader" in child_frames
    assert layered.outlier_ranks == [6], explain(layered)
    assert layered.eviction.groups == ((2, 6),)
    assert layered.nodes == ["n1", "n3"]
    assert dp.nodes == ["n3"]
