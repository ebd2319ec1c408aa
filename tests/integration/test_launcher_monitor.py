"""The in-job monitor on the real mini-cluster: a 3 + 1 run, faults injected
into a node's probes with the real CLI (`slurm-robust inject probe`) while it trains.

- A hardware Xid (79) on one node's GPU: the node is evicted to the spare within 15 s of
  the injection, no step is lost, the final digest equals the fault-free run's, and the
  verdict names the Xid.
- A port flap (the IB port's ``link_downed`` counter moves) once: recorded, not evicted;
  twice within the window (shortened to 6 s by this run's site config): evicted.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_robust.launcher.control.state import load_state
from slurm_robust.records import read_records
from tests.integration import test_launcher_faults as faults
from tests.integration.test_launcher_faults import (
    CLI,
    STEPS,
    Run,
    the_incident,
    verdict_time,
    wait_drained,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# The fault tests' fixtures: the fault-free digest and the run factory.
baseline_sha = faults.baseline_sha
runs = faults.runs

SLOW_STEPS = ["--steps", str(STEPS), "--min-step-time", "0.8"]
IB_PORT = {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
           "rate": "200 Gb/sec (4X HDR)"}


def inject_probe(env: dict, node: str, probe: str, value: object) -> float:
    out = subprocess.run([*CLI, "inject", "probe", "--node", node, "--probe", probe,
                          "--value", json.dumps(value)], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return time.time()


def clear_probes(env: dict, node: str) -> None:
    subprocess.run([*CLI, "inject", "clear", "--node", node], env=env, capture_output=True,
                   text=True, timeout=60)


def victim_of(run) -> str:
    slots = load_state(run.paths.state).slots
    return next(n for n in slots[1:] if n != run.controller_node())


def wait_for(what: str, probe, timeout: float = 60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen in {timeout} s")


def test_a_hardware_xid_evicts_the_node_to_the_spare(runs, baseline_sha, minicluster):
    run = runs("monxid", train_args=SLOW_STEPS)
    run.wait_step(5)
    victim = victim_of(run)
    runs.killed.append(victim)  # its verdict drains it at job end; resumed at teardown
    try:
        injected = inject_probe(minicluster.env, victim, "xid_events", [{"gpu": 0, "xid": 79}])
        end = run.wait_end()
        inc = the_incident(run)
        assert (inc["class"], inc["rung"], inc["nodes"]) == ("gpu_unavailable", "spare",
                                                            [victim])
        assert inc["localized_at"] - injected <= 15.0, inc
        assert inc["steps_lost"] == 0 and inc["restore_tier"] == "peer", inc
        assert inc["evidence"]["monitor"]["check"] == "gpu_xid"
        findings = [e for e in run.events("finding") if e["node"] == victim]
        assert findings and findings[0]["severity"] == "fatal"
        assert findings[0]["seen_at"] <= inc["detected_at"]  # seen on the node first
        verdicts = read_records(run.paths.verdicts).records
        assert [(v["node"], v["class"]) for v in verdicts] == [(victim, "gpu_unavailable")]
        assert "gpu_xid: Xid 79" in verdicts[0]["reason"], verdicts
        assert victim not in load_state(run.paths.state).slots
        assert end["status"] == "completed" and end["params_sha256"] == baseline_sha
    finally:
        clear_probes(minicluster.env, victim)
        if read_records(run.paths.verdicts).records:
            run.cancel()
            assert wait_drained(minicluster, victim, verdict_time(run)), \
                f"{victim} not drained at job end"


def test_a_port_flap_once_is_recorded_twice_in_the_window_evicts(runs, baseline_sha,
                                                                 minicluster):
    # This run's own site config: the cluster's, with a network schedule of 1 s and a
    # 6 s window (ByteRobust: 30 s and 5 minutes).
    site = json.loads(Path(minicluster.env["SLURM_ROBUST_CONFIG"]).read_text())
    site["monitor"] = {"network": {"interval_s": 1.0, "window_s": 6.0}}
    conf = Path(minicluster.cfg.shared_dir) / f"monitor-site-{int(time.time())}.json"
    conf.write_text(json.dumps(site))
    conf.chmod(0o644)
    cluster = SimpleNamespace(env=dict(minicluster.env, SLURM_ROBUST_CONFIG=str(conf)),
                              cfg=minicluster.cfg)
    run = Run(cluster, "monflap", 1, train_args=SLOW_STEPS)
    victim = None
    try:
        run.wait_step(3)
        victim = victim_of(run)
        runs.killed.append(victim)  # its verdict drains it at job end; resumed at teardown
        port = {**IB_PORT, "counters": {"link_downed": 0}}
        inject_probe(minicluster.env, victim, "ib_ports", [port])
        time.sleep(2.0)  # the monitor reads the port once as it is
        inject_probe(minicluster.env, victim, "ib_ports",
                     [{**IB_PORT, "counters": {"link_downed": 1}}])
        first = wait_for("the first flap's finding", lambda: [
            e for e in run.events("finding") if e["node"] == victim
            and e["check"] == "net_ib_ports"], timeout=15.0)
        assert first[0]["severity"] == "warning"
        time.sleep(6.0 + 2.0)  # past the window: one flap was recorded, nothing else
        assert run.events("incident") == [] and victim in load_state(run.paths.state).slots
        inject_probe(minicluster.env, victim, "ib_ports",
                     [{**IB_PORT, "counters": {"link_downed": 2}}])
        time.sleep(2.0)
        inject_probe(minicluster.env, victim, "ib_ports",
                     [{**IB_PORT, "counters": {"link_downed": 3}}])
        end = run.wait_end()
        inc = the_incident(run)
        assert (inc["class"], inc["rung"], inc["nodes"]) == ("network", "spare", [victim])
        assert inc["evidence"]["monitor"]["alerts_in_window"] == 2
        assert end["status"] == "completed" and end["params_sha256"] == baseline_sha
    finally:
        if victim is not None:
            clear_probes(minicluster.env, victim)
        if victim is not None and read_records(run.paths.verdicts).records:
            run.cancel()
            assert wait_drained(minicluster, victim, verdict_time(run)), \
                f"{victim} not drained at job end"
        run.cancel()
