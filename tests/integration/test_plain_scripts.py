"""Unmodified torchrun-style scripts on the real mini-cluster.

examples/train_plain.py imports nothing of slurm_robust: it keeps its own ckpt.pt and
resumes with --init_from=resume. These runs prove: a script that reports no steps is
never killed for silence (with the hang floor and the startup timeout both cut to 5 s);
a killed worker's restart resumes from the script's own checkpoint through
--resume-args/--resume-if-exists; with --auto-steps the same run reports steps, so
`status` shows them and the report has a true ETTR.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PLAIN = REPO / "examples" / "train_plain.py"
CLI = [sys.executable, "-m", "slurm_robust.cli.main"]
NODES = 2
CKPT_EVERY = 10
ITER = re.compile(r"^iter (\d+):", re.M)
RESUMED = re.compile(r"^resuming from .* at iter (\d+)$", re.M)


class PlainRun:
    def __init__(self, cluster, name: str, extra: list[str], train: list[str]) -> None:
        self.env = cluster.env
        self.run_dir = str(cluster.cfg.shared_dir / f"test-{name}-{int(time.time() * 1000)}")
        self.out = f"{self.run_dir}/out"
        argv = [*CLI, "submit", "--nodes", str(NODES), "--spares", "0", "--time", "10",
                "--folder", self.run_dir, "--json",
                *[a.replace("{out}", self.out) for a in extra], "--", sys.executable,
                str(PLAIN), "--out_dir", self.out, "--ckpt_interval", str(CKPT_EVERY),
                "--log_interval", "1", *train]
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr
        self.job_id = json.loads(out.stdout)["job_id"]
        self.paths = RunPaths.of(self.run_dir)

    def events(self, kind: str) -> list[dict]:
        return [e for e in read_records(self.paths.events).records if e["event"] == kind]

    def log(self, attempt: int) -> str:
        logs = sorted(Path(self.run_dir, "logs", f"attempt{attempt}").glob("gen*/rank0.log"))
        return logs[-1].read_text(errors="replace") if logs else ""

    def wait(self, what: str, probe, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if probe():
                return
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}; run dir {self.run_dir}")

    def wait_end(self, timeout: float = 300.0) -> dict:
        self.wait("run_end", lambda: self.events("run_end"), timeout)
        return self.events("run_end")[-1]

    def cli(self, *args: str) -> str:
        out = subprocess.run([*CLI, *args], env=self.env, capture_output=True, text=True,
                             timeout=120, cwd=REPO)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def cancel(self) -> None:
        subprocess.run(["scancel", self.job_id], env=self.env, timeout=30)


@pytest.fixture
def plain(minicluster):
    started: list[PlainRun] = []

    def submit(name: str, extra: list[str], train: list[str], cluster=None) -> PlainRun:
        run = PlainRun(cluster or minicluster, name, extra, train)
        started.append(run)
        return run

    yield submit
    for run in started:
        run.cancel()


def test_silent_script_outlives_hang_floor_and_startup_timeout(plain):
    # ~30 s without a single step report, against a 5 s hang floor and startup timeout:
    # before plain scripts were supported this was "hang: no step for 5 s" and a restart
    # from scratch.
    run = plain("silent", ["--hang-timeout", "5", "--startup-timeout", "5"],
                ["--max_iters", "60", "--iter_sleep", "0.5"])
    end = run.wait_end()
    assert end["status"] == "completed", end
    assert run.events("incident") == []
    assert "done: 60 iterations" in run.log(0)
    status = run.cli("status", run.run_dir)
    assert "no step reports" in status and "step None" not in status


def kill_mid_run(run: PlainRun, at_iter: int = 25) -> tuple[int, int]:
    """Kill rank 1 once rank 0 logged ``at_iter``; returns (last iter logged before
    the kill, iter the restart resumed from)."""
    run.wait(f"iter {at_iter}", lambda: max(map(int, ITER.findall(run.log(0))),
                                            default=0) >= at_iter, 180)
    out = subprocess.run([*CLI, "inject", "kill-worker", "--job", run.job_id, "--json",
                          "--rank", "1"], env=run.env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    end = run.wait_end()
    assert end["status"] == "completed", end
    before = max(map(int, ITER.findall(run.log(0))))
    resumed = RESUMED.findall(run.log(1))
    assert resumed, run.log(1)[-2000:]
    assert "done: 60 iterations" in run.log(1)
    return before, int(resumed[0])


def test_kill_worker_resumes_from_the_scripts_own_checkpoint(plain):
    run = plain("resume", ["--resume-args", "--init_from=resume", "--resume-if-exists",
                           "{out}/ckpt.pt"], ["--max_iters", "60", "--iter_sleep", "0.2"])
    before, resumed = kill_mid_run(run)
    assert resumed >= CKPT_EVERY and before - resumed <= CKPT_EVERY, (before, resumed)
    incidents = run.events("incident")
    assert len(incidents) == 1 and incidents[0]["rung"] == "in_place", incidents
    assert incidents[0]["recovered_at"] is not None and incidents[0]["steps_lost"] is None
    assert "no step reports" in run.cli("status", run.run_dir)


def test_auto_steps_reports_steps_and_a_true_ettr(plain):
    run = plain("autosteps", ["--auto-steps", "--resume-args", "--init_from=resume",
                              "--resume-if-exists", "{out}/ckpt.pt"],
                ["--max_iters", "60", "--iter_sleep", "0.2"])
    before, resumed = kill_mid_run(run)
    assert before - resumed <= CKPT_EVERY, (before, resumed)
    inc = run.events("incident")
    assert len(inc) == 1 and inc[0]["restored_step"] == resumed, inc
    assert 0 <= inc[0]["steps_lost"] <= CKPT_EVERY, inc
    status = json.loads(run.cli("status", run.run_dir, "--json"))
    assert status["step_reports"] and status["step"] == 60, status
    head = json.loads(run.cli("report", run.run_dir, "-o", f"{run.run_dir}/report",
                              "--json"))
    assert 0 < head["ettr"] <= 1, head


def test_rdma_ports_gone_silent_after_traffic_is_an_implicit_hang(plain, minicluster):
    # ByteRobust's zero-RDMA rule on a script that reports no steps: each node's RDMA port
    # counters (injected through the probe layer, as the monitor reads them on a real
    # node) move while the job trains, then freeze: the generation is declared hung
    # (stacks captured, then the ladder), with the silent ports as its evidence. The
    # silent-script test above is the other half: no RDMA ports, no hang.
    site = json.loads(Path(minicluster.env["SLURM_ROBUST_CONFIG"]).read_text())
    site["monitor"] = {"sample": {"interval_s": 1.0}}
    conf = Path(minicluster.cfg.shared_dir) / f"rdma-site-{int(time.time())}.json"
    conf.write_text(json.dumps(site))
    conf.chmod(0o644)
    cluster = SimpleNamespace(env=dict(minicluster.env, SLURM_ROBUST_CONFIG=str(conf)),
                              cfg=minicluster.cfg)
    run = plain("rdma", ["--hang-timeout", "5"], ["--max_iters", "400", "--iter_sleep", "0.5"],
                cluster)
    nodes: list[str] = []
    try:
        run.wait("the run's nodes", lambda: bool(_slot_nodes(run)), 120)
        nodes = _slot_nodes(run)
        run.wait("iter 3", lambda: max(map(int, ITER.findall(run.log(0))), default=0) >= 3,
                 120)
        words = 0
        for _ in range(8):  # collective traffic: ~40 MB/s per port
            words += 10_000_000
            for node in nodes:
                _inject_port(run.env, node, words)
            time.sleep(1.0)
        frozen = time.time()
        run.wait("the implicit hang's incident", lambda: run.events("incident"), 60)
        inc = run.events("incident")[0]
        assert inc["class"] == "job_hang", inc
        assert inc["evidence"]["implicit_hang"] == {n: "rdma_silent" for n in nodes}
        assert inc["detected_at"] - frozen <= 5.0 + 10.0, (inc["detected_at"], frozen)
    finally:
        for node in nodes:
            subprocess.run([*CLI, "inject", "clear", "--node", node], env=run.env,
                           capture_output=True, text=True, timeout=60)
        run.cancel()


def _slot_nodes(run: PlainRun) -> list[str]:
    try:
        return sorted(set(load_state(run.paths.state).slots))
    except (OSError, ValueError, KeyError):
        return []


def _inject_port(env: dict, node: str, words: int) -> None:
    port = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
            "rate": "200 Gb/sec (4X HDR)",
            "counters": {"link_downed": 0, "port_xmit_data": words, "port_rcv_data": words}}
    out = subprocess.run([*CLI, "inject", "probe", "--node", node, "--probe", "ib_ports",
                          "--value", json.dumps([port])], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
