"""Fail-slow detection in the launcher: busy times in, a node evicted to a spare.

The vote's thresholds are unit-tested with the library (test_stacks_failslow.py); here:
what the controller builds from a RunConfig, and the whole path with a real controller,
real agents (threads) and tiny real worker processes that report ``busy_s`` the way
slurm_robust.train does. The slow worker really spends longer in its "compute".
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import failslow
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.identity import Identity
from slurm_robust.launcher.node.agent import Agent
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records

NODES = ["n1", "n2", "n3"]

# Lock-step like a collective; "compute" is a sleep, 7x longer on the slow node(s) from
# step SLOW_FROM on. busy_s covers the compute only, as `with run.busy():` would.
WORKER = textwrap.dedent("""
    import json, os, sys, time
    rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
    steps, slow_node, slow_from = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    node = os.environ["SLURM_ROBUST_NODE"]
    ck = os.path.join(os.environ["SLURM_ROBUST_RUN_DIR"], f"ck{rank}")
    out = open(os.environ["SLURM_ROBUST_PROGRESS"], "a", buffering=1)
    start = int(open(ck).read()) if os.path.exists(ck) else 0
    out.write(json.dumps({"kind": "restored", "step": start or None,
                          "tier": "memory" if start else None}) + "\\n")
    def done(r):
        try:
            return int(open(ck[:-1] + str(r)).read())
        except (OSError, ValueError):
            return 0
    for step in range(start + 1, steps + 1):
        slow = step >= slow_from and slow_node in (node, "all")
        t0 = time.monotonic()
        time.sleep(0.14 if slow else 0.02)
        busy = time.monotonic() - t0
        while min(done(r) for r in range(world)) < step - 1:
            time.sleep(0.003)
        open(ck + ".tmp", "w").write(str(step)); os.replace(ck + ".tmp", ck)
        out.write(json.dumps({"kind": "step", "step": step, "loss": 1.0, "grad_norm": 1.0,
                              "t": time.time(), "busy_s": busy}) + "\\n")
    out.write(json.dumps({"kind": "final", "step": steps, "params_sha256": "f" * 64}) + "\\n")
""")


def ident(i: int) -> Identity:
    return Identity(index=i, node=f"n{i + 1}", job_id="778", step_key="778.0.0",
                    restart_count=0)


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"shm_root": str(tmp_path / "nodes/{node}/shm"),
                                "local_root": str(tmp_path / "nodes/{node}/local"),
                                "verdict_log": str(tmp_path / "log/verdicts.jsonl")}))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    def start(steps: int, slow_node: str, slow_from: int = 8) -> tuple[RunConfig, dict]:
        # hang_floor_s well above a step: on a loaded CI box a slow step is not a hang here.
        cfg = RunConfig(command=(sys.executable, str(script), str(steps), slow_node,
                                 str(slow_from)),
                        run_dir=str(tmp_path / "run"), nodes=3, spares=1,
                        site_config=str(site), hang_floor_s=20.0, heartbeat_timeout_s=2.0,
                        local_every=0, durable_every=0, grace_s=0.2, prewarm=("json",),
                        fail_slow_interval_s=0.3)
        ctl = Controller(cfg, ident(0))
        ctl.start()
        threads = [threading.Thread(target=Agent(cfg, ident(i)).run, daemon=True)
                   for i in range(cfg.total_nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads), "agents did not end"
        return cfg, ctl.join()

    return start


def events(cfg: RunConfig, kind: str) -> list[dict]:
    return [e for e in read_records(RunPaths.of(cfg.run_dir).events).records
            if e["event"] == kind]


def test_slow_node_is_evicted_to_the_spare(run):
    cfg, result = run(steps=70, slow_node="n3")
    assert result.status == "completed"
    [inc] = events(cfg, "incident")
    assert (inc["class"], inc["category"], inc["rung"]) == ("mfu_decline", "implicit", "spare")
    assert inc["nodes"] == ["n3"] and inc["ranks"] == [2]
    assert inc["localized_at"] == inc["detected_at"] > inc["fault_time"]
    assert inc["recovered_at"] > inc["detected_at"]
    votes = inc["evidence"]["votes"]
    assert votes["pp:[2]"] >= cfg.fail_slow_min_votes
    flagged = [r for r in inc["evidence"]["rounds"] if r["flagged"] == "pp:[2]"]
    assert all(r["slow_ranks"] == [2] for r in flagged)
    verdicts = read_records(RunPaths.of(cfg.run_dir).verdicts).records
    assert [(v["node"], v["class"]) for v in verdicts] == [("n3", "mfu_decline")]
    [_, second] = events(cfg, "attempt_start")
    assert second["nodes"] == ["n1", "n2", "n4"]


def test_uniform_slowness_evicts_nothing(run):
    cfg, result = run(steps=60, slow_node="all")
    assert result.status == "completed"
    assert events(cfg, "incident") == []


def test_monitor_follows_the_config():
    cfg = RunConfig(command=("x",), run_dir="/tmp/x", nodes=3, fail_slow_interval_s=1.0)
    mon = failslow.new_monitor(cfg, NODES)
    assert mon is not None and mon.options.interval_s == 1.0
    now = 0.0
    decision = None
    while decision is None and now < 10.0:
        for rank, busy in enumerate((0.1, 0.1, 0.3)):
            mon.record(rank, busy, now)
        now += 0.25
        decision = mon.poll(now)
    assert decision is not None and decision.eviction.nodes == ("n3",)
    inc = failslow.incident_of(decision, "i1", 12, now, 1.0).record()
    assert (inc["class"], inc["category"], inc["nodes"], inc["ranks"]) == \
        ("mfu_decline", "implicit", ["n3"], [2])
    assert inc["detected_at"] == inc["localized_at"] == now
    off = RunConfig(command=("x",), run_dir="/tmp/x", nodes=3, fail_slow=False)
    assert failslow.new_monitor(off, NODES) is None


def test_busy_values_from_workers_are_checked():
    assert failslow.busy_of(0.25) == 0.25
    for bad in (None, "0.2", True, -1.0, float("nan"), float("inf")):
        assert failslow.busy_of(bad) is None


@pytest.mark.parametrize("bad", [{"fail_slow_min_votes": 6}, {"fail_slow_factor": 1.0},
                                 {"fail_slow_min_excess_s": -1.0},
                                 {"fail_slow_interval_s": 0}, {"fail_slow_window": 0}])
def test_bad_thresholds_are_refused(bad):
    with pytest.raises(UsageError, match="fail-slow"):
        RunConfig(command=("x",), run_dir="/tmp/x", **bad)
