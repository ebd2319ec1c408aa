"""Monitor findings at the recovery owner: a fatal finding evicts its node through the
ladder (spare, else requeue), a warning is only recorded; NVML samples feed the fail-slow
vote and the idle-hang rule. Fake clock and scripted reports (the recovery harness)."""

from __future__ import annotations

import pytest

from slurm_robust.launcher.enums import Phase, Role, Severity
from slurm_robust.launcher.messages import BadMessage, Finding, NodeSample, Report
from slurm_robust.launcher.paths import RunPaths
from slurm_robust.records import read_records
from tests.unit.launcher.control.test_recovery_owner import Harness


def _xid(t: float) -> Finding:
    return Finding.from_json({"kind": "gpu", "check": "gpu_xid", "severity": "fatal",
                              "class": "gpu_unavailable", "time": t,
                              "reason": "gpu_xid: Xid 79 on GPU 0, expected no critical Xid",
                              "evidence": {"events": [{"gpu": 0, "xid": 79}]}})


def _events(h: Harness, kind: str) -> list[dict]:
    return [r for r in read_records(RunPaths.of(h.cfg.run_dir).events).records
            if r["event"] == kind]


def test_findings_travel_in_the_report_and_are_checked_at_the_boundary():
    base = {"op": "report", "agent": 1, "node": "n2", "pid": 9, "key": "k", "time": 1.0}
    assert "findings" not in Report.from_json(base).to_json()  # the old wire, unchanged
    wire = Report(**{**base, "findings": [_xid(5.0)],
                     "sample": NodeSample(time=5.0, gpu_util=50.0)}).to_json()
    back = Report.from_json(wire)
    assert back.findings[0].severity is Severity.FATAL and back.sample.gpu_util == 50.0
    bad = dict(wire["findings"][0], severity="fatal")
    del bad["class"]
    with pytest.raises(BadMessage, match="a fatal finding needs 'class'"):
        Report.from_json({**wire, "findings": [bad]})
    with pytest.raises(BadMessage, match="severity"):
        Report.from_json({**wire, "findings": [dict(wire["findings"][0], severity="meh")]})


def test_a_fatal_finding_moves_the_node_to_the_spare(tmp_path):
    h = Harness(tmp_path)
    h.start()
    n2 = h.members[1]
    seen = h.clock() - 6.0
    h.rec.on_findings(n2, [_xid(seen)], None, h.clock())
    h.tick()
    assert h.rec.gen.slots == [0, 2] and h.rec.plan_for(1).role == Role.EVICTED
    assert ("verdict", "n2", "gpu_unavailable") in h.slurm.calls
    inc = h.rec.state.open_incident.to_json()
    assert inc["rung"] == "spare" and inc["nodes"] == ["n2"]
    assert inc["fault_time"] == seen and inc["evidence"]["monitor"]["check"] == "gpu_xid"
    assert "Xid 79" in inc["evidence"]["monitor"]["reason"]
    (event,) = _events(h, "finding")
    assert event["node"] == "n2" and event["severity"] == "fatal" and event["v"] == 1
    assert event["seen_at"] == seen and event["check"] == "gpu_xid"
    h.restored(3)
    h.steps(1)
    assert _events(h, "incident")[-1]["steps_lost"] == 0


def test_without_a_spare_a_fatal_finding_requeues_without_the_node(tmp_path):
    h = Harness(tmp_path, spares=0)
    h.start()
    h.rec.on_findings(h.members[1], [_xid(h.clock())], None, h.clock())
    h.tick()
    assert h.rec.phase is Phase.REQUEUED
    assert ("requeue", "42", ["n2"]) in h.slurm.calls


def test_a_network_fatal_finding_blames_the_node_though_network_is_not_a_node_class(tmp_path):
    h = Harness(tmp_path)
    h.start()
    f = Finding(kind="network", check="net_ib_ports", severity=Severity.FATAL, cls="network",
                reason="net_ib_ports: port mlx5_0/1 DOWN/Polling", time=h.clock())
    h.rec.on_findings(h.members[1], [f], None, h.clock())
    h.tick()
    assert h.rec.gen.slots == [0, 2]


def test_a_warning_is_recorded_and_counted_only(tmp_path):
    h = Harness(tmp_path)
    h.start()
    gen = h.gen()
    w = Finding(kind="host", check="host_mem_available", severity=Severity.WARNING,
                cls="cpu_oom", reason="host_mem_available: actual 0.5 GiB", time=h.clock())
    h.rec.on_findings(h.members[1], [w], None, h.clock())
    h.tick()
    assert h.gen() == gen and h.rec.findings.counts[("n2", "warning")] == 1
    assert _events(h, "finding")[0]["severity"] == "warning"


def test_a_fatal_finding_of_a_spare_is_recorded_not_acted_on(tmp_path):
    h = Harness(tmp_path)
    h.start()
    h.rec.on_findings(h.members[2], [_xid(h.clock())], None, h.clock())
    h.tick()
    assert h.gen() == 1 and len(_events(h, "finding")) == 1


def test_a_falling_gpu_clock_feeds_the_fail_slow_vote(tmp_path):
    h = Harness(tmp_path, nodes=3, spares=1, fail_slow=True, fail_slow_interval_s=1.0)
    h.start()
    for _ in range(12):
        t = h.clock.advance(1.0)
        for m in h.slot_members():
            clock = 700.0 if m.node == "n2" else 1980.0
            h.rec.on_findings(m, [], NodeSample(time=t, gpu_util=95.0, sm_clock_mhz=clock), t)
        h.steps(1)
        if h.rec.gen.number > 1:
            break
    assert h.rec.gen.number == 2 and h.rec.plan_for(1).role == Role.EVICTED
    assert _events(h, "incident") == []
    assert h.rec.state.open_incident.to_json()["class"] == "mfu_decline"


def test_idle_gpus_after_work_with_no_step_is_a_hang(tmp_path):
    h = Harness(tmp_path, hang_floor_s=5.0, startup_timeout_s=600.0)
    h.tick()
    t0 = h.clock()
    for i in range(12):  # busy for 3 s, then idle: the script reports no steps at all
        t = h.clock.advance(1.0)
        for m in h.slot_members():
            h.rec.on_findings(m, [], NodeSample(time=t, gpu_util=90.0 if i < 3 else 0.0), t)
        h.tick(0.0)
        if h.rec.phase is Phase.DUMPING:
            break
    assert h.rec.phase is Phase.DUMPING and h.clock() - t0 <= 10.0


def test_no_hang_while_the_gpus_stay_busy(tmp_path):
    h = Harness(tmp_path, hang_floor_s=5.0, startup_timeout_s=600.0)
    h.tick()
    for _ in range(12):
        t = h.clock.advance(1.0)
        for m in h.slot_members():
            h.rec.on_findings(m, [], NodeSample(time=t, gpu_util=90.0), t)
        h.tick(0.0)
    assert h.rec.phase is Phase.RUNNING


def _run_samples(h: Harness, sample_at) -> float:
    h.tick()
    t0 = h.clock()
    for i in range(12):
        t = h.clock.advance(1.0)
        for m in h.slot_members():
            h.rec.on_findings(m, [], sample_at(i, t), t)
        h.tick(0.0)
        if h.rec.phase is Phase.DUMPING:
            break
    return h.clock() - t0


def test_silent_rdma_after_traffic_with_no_step_is_a_hang_without_gpu_readings(tmp_path):
    # A CPU-side or NVML-less node: no GPU reading, but its RDMA ports went quiet.
    h = Harness(tmp_path, hang_floor_s=5.0, startup_timeout_s=600.0)
    took = _run_samples(h, lambda i, t: NodeSample(
        time=t, rdma_bytes_per_s=5e9 if i < 3 else 0.0))
    assert h.rec.phase is Phase.DUMPING and took <= 10.0
    gen = h.rec.gen
    assert gen is not None and set(gen.hang_signal["implicit_hang"].values()) == {"rdma_silent"}


@pytest.mark.parametrize("rdma", [None, 5e9])
def test_no_rdma_hang_without_ports_or_while_traffic_flows(tmp_path, rdma):
    # Without RDMA ports nothing is known (plain Ethernet silence is no evidence: a script
    # that reports no steps must not be killed for it); with traffic the job is working.
    h = Harness(tmp_path, hang_floor_s=5.0, startup_timeout_s=600.0)
    _run_samples(h, lambda i, t: NodeSample(time=t, net_bytes_per_s=0.0,
                                            rdma_bytes_per_s=rdma))
    assert h.rec.phase is Phase.RUNNING


def test_rdma_silent_from_the_start_is_not_a_hang(tmp_path):
    # Never seen busy: a job still loading its data is not hung.
    h = Harness(tmp_path, hang_floor_s=5.0, startup_timeout_s=600.0)
    _run_samples(h, lambda i, t: NodeSample(time=t, rdma_bytes_per_s=0.0))
    assert h.rec.phase is Phase.RUNNING
