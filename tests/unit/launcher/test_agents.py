"""Controller and agents end to end, in one process, with tiny real worker processes.

No Slurm and no torch: agents are threads with the identity Slurm would give them, the
workers are small Python scripts that speak the progress channel (docs in
slurm_robust/launcher/node/workers.py) and keep their own "checkpoint" in a file. Faults are
real signals on those real processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.control.outcome import RunOutcome
from slurm_robust.launcher.control.replies import ReplyEncoder
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.node.agent import Agent
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records

WORKER = textwrap.dedent("""
    import json, os, sys, time
    rank = int(os.environ["RANK"]); steps = int(sys.argv[1]); bug = int(sys.argv[2])
    ck = os.path.join(os.environ["SLURM_ROBUST_RUN_DIR"], f"ck{rank}")
    out = open(os.environ["SLURM_ROBUST_PROGRESS"], "a", buffering=1)
    start = int(open(ck).read()) if os.path.exists(ck) else 0
    out.write(json.dumps({"kind": "restored", "step": start or None,
                          "tier": "memory" if start else None}) + "\\n")
    world = int(os.environ["WORLD_SIZE"])
    def done(r):
        try:
            return int(open(ck[:-1] + str(r)).read())
        except (OSError, ValueError):
            return 0
    for step in range(start + 1, steps + 1):
        while min(done(r) for r in range(world)) < step - 1:  # lock-step, like a collective
            time.sleep(0.005)
        if step == bug:
            raise TypeError("deliberate: str + int")
        time.sleep(0.05)
        open(ck + ".tmp", "w").write(str(step)); os.replace(ck + ".tmp", ck)
        out.write(json.dumps({"kind": "step", "step": step, "loss": 1.0 / step,
                              "grad_norm": 1.0, "t": time.time()}) + "\\n")
    finish_s = float(os.environ.get("FINISH_S", "0"))
    if finish_s:  # slurm_robust.train's finish(): the end said first, then a long save
        out.write(json.dumps({"kind": "finishing", "step": steps}) + "\\n")
        time.sleep(finish_s)
    out.write(json.dumps({"kind": "final", "step": steps, "params_sha256": "f" * 64}) + "\\n")
""")


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"shm_root": str(tmp_path / "nodes/{node}/shm"),
                                "local_root": str(tmp_path / "nodes/{node}/local")}))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    def start(steps: int, bug: int = 0, spares: int = 1, **kw) -> tuple[RunConfig, list]:
        cfg = RunConfig(command=(sys.executable, str(script), str(steps), str(bug)),
                        run_dir=str(tmp_path / "run"), nodes=2, spares=spares,
                        site_config=str(site), hang_floor_s=kw.pop("hang_floor_s", 3.0),
                        heartbeat_timeout_s=2.0,
                        local_every=0, durable_every=0, grace_s=0.2, prewarm=("json",),
                        **kw)
        results: list = [None] * cfg.total_nodes
        ctl = Controller(cfg, ident(0))
        ctl.start()
        threads = []
        for i in range(cfg.total_nodes):
            def agent_main(i=i):
                results[i] = Agent(cfg, ident(i)).run()
            threads.append(threading.Thread(target=agent_main, daemon=True))
            threads[-1].start()
        return cfg, [ctl, threads, results]

    return start


def ident(i: int) -> Identity:
    return Identity(index=i, node=f"n{i + 1}", job_id="777", step_key="777.0.0",
                    restart_count=0)


def finish(parts, timeout: float = 60.0) -> RunOutcome:
    ctl, threads, _ = parts
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "agents did not end"
    return ctl.join()


def events(cfg: RunConfig) -> list[dict]:
    return read_records(RunPaths.of(cfg.run_dir).events).records


def wait_for_step(cfg: RunConfig, step: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(e["event"] == "step" and e["step"] >= step for e in events(cfg)):
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} never finished")


def worker_pid(cfg: RunConfig, rank: int) -> int:
    for info in RunPaths.of(cfg.run_dir).read_agents().values():
        if str(rank) in info["workers"]:
            return int(info["workers"][str(rank)])
    raise AssertionError(f"rank {rank} not published")


def test_fault_free_run_completes_with_one_writer(run):
    cfg, parts = run(steps=10)
    result = finish(parts)
    assert result.status == "completed" and result.params_sha256 == "f" * 64
    evs = events(cfg)
    kinds = [e["event"] for e in evs]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert [e["step"] for e in evs if e["event"] == "step"] == list(range(1, 11))
    start = evs[0]
    assert start["nodes"] == ["n1", "n2"] and start["spares"] == ["n3"]
    assert set(RunPaths.of(cfg.run_dir).read_agents()) == {"n1", "n2", "n3"}


def test_killed_worker_restarts_in_place(run, monkeypatch):
    # Which path each agent took to a new generation: its answer, or a push while it
    # waited (protocol.py).
    applied: list[tuple[int, int | None, str]] = []
    real_apply = Agent.apply

    def apply(self, plan):
        if plan is not None and self.gen != plan.gen:
            applied.append((self.ident.index, plan.gen, sys._getframe(1).f_code.co_name))
        return real_apply(self, plan)

    monkeypatch.setattr(Agent, "apply", apply)
    cfg, parts = run(steps=40)
    wait_for_step(cfg, 5)
    pid = worker_pid(cfg, 1)
    # The worker is a fork of the agent's fork server (forkserver.py), not a fresh exec.
    assert b"slurm_robust.launcher.node.forkserver" in open(f"/proc/{pid}/cmdline",
                                                             "rb").read()
    os.kill(pid, signal.SIGKILL)
    result = finish(parts)
    assert result.status == "completed"
    [inc] = [e for e in events(cfg) if e["event"] == "incident"]
    assert inc["class"] == "worker_signal" and inc["rung"] == "in_place"
    assert inc["ranks"] == [1] and inc["nodes"] == ["n2"]
    assert inc["recovered_at"] > inc["detected_at"] >= inc["fault_time"]
    assert inc["evidence"]["signal_name"] == "SIGKILL"
    steps = [e["step"] for e in events(cfg) if e["event"] == "step"]
    assert steps[-1] == 40
    # New generations reached agents as pushes: applied while they waited, unasked (one
    # whose report was in flight at the push got the plan in its answer instead).
    assert [a for a in applied if a[2] == "_until_next_report"], applied


def test_same_type_error_after_restart_stops_with_verdict(run):
    cfg, parts = run(steps=20, bug=6)
    result = finish(parts)
    assert result.status == "stopped"
    assert "TypeError" in result.verdict
    incs = [e for e in events(cfg) if e["event"] == "incident"]
    assert [i["rung"] for i in incs] == ["in_place", "stop"]
    assert all(i["class"] == "user_exception" for i in incs)
    end = events(cfg)[-1]
    assert end["event"] == "run_end" and end["status"] == "stopped"
    assert "TypeError" in end["verdict"]


def test_stopped_worker_is_a_hang_with_stacks_then_restarted(run):
    cfg, parts = run(steps=60, stack_method="py-spy")
    wait_for_step(cfg, 5)
    os.kill(worker_pid(cfg, 0), signal.SIGSTOP)
    result = finish(parts, timeout=90)
    assert result.status == "completed"
    [inc] = [e for e in events(cfg) if e["event"] == "incident"]
    assert inc["class"] == "job_hang" and inc["category"] == "implicit"
    assert inc["rung"] == "in_place" and inc["ranks"] == [0]
    assert inc["detected_at"] - inc["fault_time"] >= cfg.hang_floor_s
    capture = RunPaths.of(cfg.run_dir).stacks / os.path.basename(inc["evidence"]["stacks"])
    assert (capture / "rank0.json").exists() and (capture / "rank1.json").exists()


def test_a_final_save_longer_than_the_hang_limit_is_not_a_hang(run):
    # The last step, then 5 s of flushing the checkpoint pipeline (hang floor: 3 s).
    cfg, parts = run(steps=10, env={"FINISH_S": "5"})
    result = finish(parts)
    assert result.status == "completed"
    assert [e for e in events(cfg) if e["event"] == "incident"] == []


def test_agents_name_the_plan_they_hold_and_get_short_replies(run, monkeypatch):
    # Real agents: after the first full plan, a report names it and the controller answers
    # "unchanged" until the plan changes; the run is the same as with full plans.
    sent: list[bytes] = []
    real_encode = ReplyEncoder._encode  # every plan's reply and push goes through it

    def spy(self, plan, listed, held, push):
        out = real_encode(self, plan, listed, held, push)
        sent.append(out[0])
        return out

    monkeypatch.setattr(ReplyEncoder, "_encode", spy)
    cfg, parts = run(steps=10)
    result = finish(parts)
    assert result.status == "completed" and result.params_sha256 == "f" * 64
    short = [s for s in sent if s.startswith(b'{"unchanged":true')]
    full = [s for s in sent if b'"plan":{"role"' in s]
    pushed = [s for s in full if s.endswith(b',"push":true}\n')]
    assert short and full, (len(short), len(full))
    # Most answers to reports found their agent's plan as it was: a plan that changed
    # went out as a push, which answers no report (counting pushes here made the test
    # depend on how many heartbeats a loaded machine fits into the run).
    assert len(short) > len(full) - len(pushed), (len(short), len(full), len(pushed))
    # The first generation's plans reached the agents that had reported while the
    # controller gathered them as pushes (protocol.py).
    assert pushed
