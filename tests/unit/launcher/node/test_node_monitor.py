"""The in-job monitor on one node: real checks, real probe layer, injected readings.

Readings are injected the way a rehearsal does it (``inject_probe`` writes the node's
inject.json; the monitor re-reads it every pass), and the monitor is driven with its own
clock through :meth:`NodeMonitor.run_due`, so the schedules are tested without sleeping.
"""

from __future__ import annotations

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health.journal import read_journal
from slurm_robust.launcher.enums import Severity
from slurm_robust.launcher.node.monitor import MonitorSettings, NodeMonitor
from slurm_robust.site_config import SiteConfig
from slurm_robust_rehearsal.inject.probes import clear_injections, inject_probe

NODE = "n2"


@pytest.fixture
def site(tmp_path):
    return SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True,
                      monitor={"network": {"window_s": 60.0}})


def _healthy(site: SiteConfig) -> None:
    """Host and network readings that pass, so only the injected fault shows."""
    inject_probe(site, NODE, "disk_free_bytes", 1 << 40)
    inject_probe(site, NODE, "mem_available_bytes", 1 << 40)
    inject_probe(site, NODE, "ib_ports", [_port("ACTIVE")])
    inject_probe(site, NODE, "net_ifaces", [{"iface": "eth0", "operstate": "up",
                                             "carrier": 1, "stats": {"rx_bytes": 0}}])
    inject_probe(site, NODE, "kernel_log", ["6,1,0,-;booted"])


def _port(state: str, downed: int = 0) -> dict:
    return {"device": "mlx5_0", "port": 1, "state": state,
            "phys_state": "LinkUp" if state == "ACTIVE" else "Polling", "rate": "200 Gb/sec",
            "counters": {"link_downed": downed}}


def _monitor(site: SiteConfig) -> NodeMonitor:
    _healthy(site)
    mon = NodeMonitor(NODE, "7", site)
    assert mon.run_due(0.0) == []  # healthy start; the kernel log is followed from here
    return mon


def test_defaults_are_byterobusts_schedule():
    s = MonitorSettings.from_site({})
    assert (s.gpu.interval_s, s.kernel.interval_s, s.network.interval_s,
            s.host.interval_s) == (10.0, 2.0, 30.0, 30.0)
    assert (s.network_alerts, s.network_window_s) == (2, 300.0)
    assert "gpu_xid" in s.gpu.checks and "net_ib_ports" in s.network.checks


@pytest.mark.parametrize("raw, words", [
    ({"gpus": {}}, "unknown key"),
    ({"gpu": {"every": 3}}, "unknown key"),
    ({"gpu": {"interval_s": 0}}, "must be a number > 0"),
    ({"host": {"checks": ["no_such_check"]}}, "must list checks"),
    ({"network": {"alerts": 0}}, ">= 1"),
    ({"fatal_checks": ["nope"]}, "must list checks"),
])
def test_a_bad_monitor_section_is_refused_with_the_valid_keys(raw, words):
    with pytest.raises(UsageError, match=words):
        MonitorSettings.from_site(raw)


def test_a_hardware_xid_is_one_fatal_finding_journaled(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "xid_events", [{"gpu": 1, "xid": 79}])
    assert mon.run_due(5.0) == []  # the GPU kind is not due before 10 s
    (found,) = mon.run_due(10.0)
    assert found.severity is Severity.FATAL and found.cls == "gpu_unavailable"
    assert found.check == "gpu_xid" and "Xid 79" in found.reason
    assert found.evidence["events"] == [{"gpu": 1, "xid": 79}] and found.evidence["injected"]
    assert mon.run_due(20.0) == []  # the same condition next round: reported once
    findings, _ = mon.take()
    assert [f.check for f in findings] == ["gpu_xid"]
    rec = [r for r in read_journal(NODE, site) if r["suite"] == "monitor"]
    assert rec[-1]["check"] == "gpu_xid" and rec[-1]["status"] == "fail"
    assert rec[-1]["evidence"]["severity"] == "fatal"


def test_an_application_xid_is_a_warning(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "xid_events", [{"gpu": 0, "xid": 13}])
    (found,) = mon.run_due(10.0)
    assert found.severity is Severity.WARNING and found.cls == "cuda_error"


def test_uncorrectable_ecc_is_fatal(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "ecc_uncorrectable", [0, 2])
    (found,) = mon.run_due(10.0)
    assert found.check == "gpu_ecc" and found.severity is Severity.FATAL
    assert found.cls == "gpu_memory_error"


def test_the_kernel_log_is_followed(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "kernel_log", [
        "6,1,0,-;booted",
        # Begins with the process name (user text): only the kill line below counts.
        "4,2,0,-;python invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), "
        "order=0, oom_score_adj=0",
        "6,3,0,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
        "mems_allowed=0,oom_memcg=/slurm/uid_1000/job_7,task=python,pid=4242,uid=1000",
        "3,4,0,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=991, GPU has fallen off the bus."])
    found = mon.run_due(2.0)
    assert [(f.evidence["event"], f.severity) for f in found] == [
        ("oom_kill", Severity.WARNING), ("xid", Severity.FATAL)]
    assert found[1].evidence["xid"] == 79 and found[1].cls == "gpu_unavailable"
    assert mon.run_due(4.0) == []  # the cursor: each line once


def test_a_port_that_flaps_once_is_a_warning_twice_in_the_window_fatal(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "ib_ports", [_port("DOWN")])
    (first,) = mon.run_due(30.0)
    assert first.severity is Severity.WARNING and first.cls == "network"
    inject_probe(site, NODE, "ib_ports", [_port("ACTIVE", downed=1)])
    assert mon.run_due(60.0) == []  # up again; the counter counts the down we saw
    inject_probe(site, NODE, "ib_ports", [_port("DOWN", downed=1)])
    (second,) = mon.run_due(91.0)
    assert second.severity is Severity.WARNING  # 91 - 30 > the 60 s window
    inject_probe(site, NODE, "ib_ports", [_port("DOWN", downed=2)])
    found = mon.run_due(121.0)
    assert found[-1].severity is Severity.FATAL
    assert found[-1].evidence["alerts_in_window"] == 2


def test_a_flap_between_two_checks_counts_through_link_downed(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "ib_ports", [_port("ACTIVE", downed=1)])
    (found,) = mon.run_due(30.0)
    assert "link_downed 0 -> 1" in found.reason and found.severity is Severity.WARNING
    inject_probe(site, NODE, "ib_ports", [_port("ACTIVE", downed=2)])
    (found,) = mon.run_due(60.0)
    assert found.severity is Severity.FATAL  # the second alert within the window


def test_two_flaps_between_two_checks_are_two_alerts(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "ib_ports", [_port("ACTIVE", downed=2)])
    found = mon.run_due(30.0)
    assert [f.severity for f in found] == [Severity.WARNING, Severity.FATAL]


def test_host_findings_are_warnings_and_a_recovery_clears_them(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "mem_available_bytes", 1)
    (found,) = mon.run_due(30.0)
    assert found.check == "host_mem_available" and found.severity is Severity.WARNING
    inject_probe(site, NODE, "mem_available_bytes", 1 << 40)
    assert mon.run_due(60.0) == []
    inject_probe(site, NODE, "mem_available_bytes", 1)
    assert len(mon.run_due(90.0)) == 1  # a new episode is a new finding


def test_samples_carry_gpu_use_clock_and_traffic(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "gpu_utilization", [90, 70])
    inject_probe(site, NODE, "sm_clock_mhz", [1980, 1020])
    inject_probe(site, NODE, "net_ifaces", [{"iface": "eth0", "operstate": "up",
                                             "carrier": 1, "stats": {"rx_bytes": 5000,
                                                                     "tx_bytes": 5000}}])
    mon.run_due(10.0)
    _, sample = mon.take()
    assert sample.gpu_util == 80.0 and sample.sm_clock_mhz == 1500.0
    assert sample.net_bytes_per_s == 1000.0  # 10000 bytes over 10 s


def test_without_nvml_the_gpu_checks_skip_quietly(site):
    mon = _monitor(site)
    clear_injections(site, NODE, "xid_events")
    assert mon.run_due(10.0) == []


def _traffic_port(words: int) -> dict:
    return {**_port("ACTIVE"), "counters": {"link_downed": 0, "port_xmit_data": words,
                                            "port_rcv_data": words}}


def test_the_sample_carries_rdma_traffic_from_the_port_counters(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "ib_ports", [_traffic_port(1000)])
    mon.run_due(10.0)
    inject_probe(site, NODE, "ib_ports", [_traffic_port(1000 + 2500)])
    mon.run_due(20.0)
    _found, sample = mon.take()
    # Both counters count 4-byte words: 2 x 2500 words x 4 bytes over 10 s.
    assert sample is not None and sample.rdma_bytes_per_s == 2000.0


def test_a_node_without_rdma_ports_has_no_rdma_reading(site):
    mon = _monitor(site)
    inject_probe(site, NODE, "ib_ports", [])
    mon.run_due(10.0)
    mon.run_due(20.0)
    _found, sample = mon.take()
    assert sample is not None and sample.rdma_bytes_per_s is None
