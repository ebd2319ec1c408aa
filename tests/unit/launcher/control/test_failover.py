"""Controller failover, in one process with tiny real workers (test_agents.py).

The controller runs for agent 1 (as on a cluster, off the batch node). Holding its lock
freezes it: no tick, no answer, and once the loop has stood still for ``frozen_s`` (lowered
here from FROZEN_S: a late controller keeps its lease that long), no lease, as SIGSTOP
would at once. Agent 0 must take over at
the next term, the frozen controller's slot must go to the spare, and the old controller
must stand down once unfrozen, without writing a plan or the state again.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import failover
from slurm_robust.launcher.control.controller import Controller
from slurm_robust.launcher.control.state import load_state
from slurm_robust.launcher.control.succession import Outcome, after_controller_loss
from slurm_robust.launcher.node.agent import Agent
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records
from tests.unit.launcher.test_agents import WORKER, ident, wait_for_step


@pytest.fixture
def cfg(tmp_path, monkeypatch) -> RunConfig:
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    site = tmp_path / "site.json"
    site.write_text(json.dumps({"shm_root": str(tmp_path / "nodes/{node}/shm"),
                                "local_root": str(tmp_path / "nodes/{node}/local")}))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return RunConfig(command=(sys.executable, str(script), "150", "0"),
                     run_dir=str(tmp_path / "run"), nodes=2, spares=1,
                     site_config=str(site), hang_floor_s=5.0, heartbeat_timeout_s=1.5,
                     local_every=0, durable_every=0, grace_s=0.2, prewarm=("json",))


def events(cfg: RunConfig, kind: str | None = None) -> list[dict]:
    recs = read_records(RunPaths.of(cfg.run_dir).events).records
    return [e for e in recs if kind is None or e["event"] == kind]


def test_first_controller_is_off_the_batch_node():
    assert failover.first_controller_index(1) == 0
    assert failover.first_controller_index(4) == 1


def test_one_claim_per_term_and_the_fence(tmp_path):
    paths = RunPaths.of(tmp_path)
    assert failover.claim_term(paths, "1.0.0", 2, {"agent": 0})
    assert not failover.claim_term(paths, "1.0.0", 2, {"agent": 2})
    assert failover.superseded(paths, "1.0.0", 1)
    assert not failover.superseded(paths, "1.0.0", 2)
    assert failover.lease_age(paths) is None
    failover.renew_lease(paths, 2)
    age = failover.lease_age(paths)
    assert age is not None and age < 1.0


def test_without_a_spare_the_successor_is_the_requeue(cfg):
    # Old state (no membership saved) or no spare parked: the requeue rung, as before.
    assert after_controller_loss(cfg, ident(0), 1, node_state=lambda n: None).outcome \
        is Outcome.REQUEUE


def test_frozen_controller_is_replaced_and_stands_down(cfg):
    old = Controller(cfg, ident(1))
    old.start()
    agents = [Agent(cfg, ident(i)) for i in range(cfg.total_nodes)]
    agents[1].local_controller = old.alive
    codes: list = [None] * len(agents)
    threads = [threading.Thread(target=lambda i=i: codes.__setitem__(i, agents[i].run()),
                                daemon=True) for i in range(len(agents))]
    for t in threads:
        t.start()
    wait_for_step(cfg, 5)
    first_term = old.term
    old.frozen_s = 2.0  # the lease lapses 2 s into the freeze
    old.lock.acquire()  # frozen: no tick, no answer, then no lease renewal
    frozen_at = time.time()
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not agents[0].controllers:
            time.sleep(0.05)
        assert agents[0].controllers, "agent 0 did not take over"
        time.sleep(max(0.0, frozen_at + 6.0 - time.time()))
        assert load_state(RunPaths.of(cfg.run_dir).state).term == first_term + 1
    finally:
        old.lock.release()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "agents did not end"
    assert old.join().status == "stood_down"
    result = agents[0].controllers[0].join()
    assert result.status == "completed", result
    [takeover] = events(cfg, "controller")
    assert takeover["term"] == first_term + 1 and takeover["node"] == "n1"
    assert takeover["takeover"]["previous_agent"] == 1
    [inc] = events(cfg, "incident")
    assert (inc["class"], inc["rung"], inc["nodes"]) == ("node_lost", "spare", ["n2"])
    assert inc["evidence"]["controller_lost"] is True
    # The fault time is when the successor last heard the old controller, not the takeover.
    assert inc["fault_time"] <= frozen_at + 0.5 < inc["detected_at"]
    attempts = [e["attempt"] for e in events(cfg, "attempt_start")]
    assert attempts == sorted(set(attempts))
    assert len(events(cfg, "run_end")) == 1
    state = load_state(RunPaths.of(cfg.run_dir).state)
    assert state.term == first_term + 1 and state.finished == "completed"
    assert state.slots == ["n1", "n3"]


def test_an_agent_frozen_through_a_takeover_follows_and_never_requeues(cfg):
    # Agent 1 knew term 1; while it was frozen agent 0 took over (term 2) and used the
    # spare. Resumed, it must follow the new controller, not requeue the job.
    paths = RunPaths.of(cfg.run_dir)
    paths.root.mkdir(parents=True)
    paths.controller.write_text(json.dumps({"key": "777.0.0", "term": 2, "agent": 0,
                                            "node": "n1", "host": "127.0.0.1", "port": 1}))
    got = after_controller_loss(cfg, ident(1), 1, node_state=lambda n: None)
    assert got.outcome is Outcome.FOLLOW


def test_losing_the_batch_node_requeues_other_faults_there_take_the_spare():
    from slurm_robust.launcher.control.ladder import Facts, decide
    from slurm_robust.launcher.enums import Rung

    def rung(cls: str) -> str:
        return decide(Facts(cls=cls, named=("n1",), blame_named=True, controller_node="n2",
                            spares_left=1, restarts=0, max_restarts=5,
                            signature=None, signature_seen=0, no_progress=0,
                            max_no_progress=3, batch_node="n1")).rung

    assert rung("node_lost") == Rung.REQUEUE      # the batch step died with the node
    assert rung("gpu_unavailable") == Rung.SPARE  # the batch step still runs there
