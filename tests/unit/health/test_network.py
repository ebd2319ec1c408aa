"""Network probes (sysfs readers on a fake tree) and the network checks on their output."""

from __future__ import annotations

from pathlib import Path

from slurm_robust.health import netsys
from slurm_robust.health.checks import network
from slurm_robust.health.framework import CheckContext, Status, registered_checks, run_check
from slurm_robust.health.probes import NETWORK_PROBES, PROBES, Probes
from slurm_robust.site_config import SiteConfig


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _ib_tree(root: Path, state: str = "4: ACTIVE", downed: int = 0) -> None:
    port = root / "mlx5_0" / "ports" / "1"
    _write(port / "state", state)
    _write(port / "phys_state", "5: LinkUp" if "ACTIVE" in state else "3: Disabled")
    _write(port / "rate", "200 Gb/sec (4X HDR)")
    _write(port / "counters" / "link_downed", str(downed))
    _write(port / "counters" / "symbol_error", "3")
    _write(port / "counters" / "port_xmit_data", "not-a-number")


def test_ib_ports_reads_state_rate_and_counters(tmp_path):
    _ib_tree(tmp_path, downed=2)
    (port,) = netsys.ib_ports(str(tmp_path))
    assert port["device"] == "mlx5_0" and port["port"] == 1
    assert port["state"] == "ACTIVE" and port["phys_state"] == "LinkUp"
    assert port["rate"].startswith("200 Gb/sec")
    assert port["counters"] == {"link_downed": 2, "symbol_error": 3}  # bad value left out


def test_no_infiniband_reads_as_no_ports(tmp_path):
    assert netsys.ib_ports(str(tmp_path / "absent")) == []


def test_net_ifaces_skips_loopback_and_reads_statistics(tmp_path):
    for name, state, carrier in (("lo", "unknown", "1"), ("eth0", "up", "1"),
                                 ("eth1", "down", None)):
        _write(tmp_path / name / "operstate", state)
        if carrier is not None:
            _write(tmp_path / name / "carrier", carrier)
        _write(tmp_path / name / "statistics" / "rx_bytes", "100")
        _write(tmp_path / name / "statistics" / "rx_errors", "0")
    ifaces = {i["iface"]: i for i in netsys.net_ifaces(str(tmp_path))}
    assert set(ifaces) == {"eth0", "eth1"}
    assert ifaces["eth0"]["carrier"] == 1 and ifaces["eth1"]["carrier"] is None
    assert ifaces["eth0"]["stats"] == {"rx_bytes": 100, "rx_errors": 0}


def test_network_probes_are_injectable():
    assert set(NETWORK_PROBES) <= set(PROBES)


def _run(name: str, injected: dict, **params) -> object:
    chk = registered_checks()[name]
    ctx = CheckContext(Probes(injected).view(), "n1", None, "manual", SiteConfig())
    return run_check(chk, ctx, chk.resolve_params(params))


def _port(state: str, phys: str = "LinkUp") -> dict:
    return {"device": "mlx5_0", "port": 1, "state": state, "phys_state": phys,
            "rate": "200 Gb/sec", "counters": {"link_downed": 1}}


def test_an_active_port_passes_and_a_down_one_fails():
    assert _run("net_ib_ports", {"ib_ports": [_port("ACTIVE")]}).status is Status.OK
    res = _run("net_ib_ports", {"ib_ports": [_port("DOWN", "Polling")]})
    assert res.status is Status.FAIL and "mlx5_0/1 DOWN/Polling" in res.reason
    assert res.evidence["ports"][0]["errors"] == {"link_downed": 1}
    assert _run("net_ib_ports", {"ib_ports": [_port("DOWN")]},
                ignore=["mlx5_0/1"]).status is Status.OK


def test_ethernet_lost_carrier_warns_admin_down_is_ignored_required_fails():
    up = {"iface": "eth0", "operstate": "up", "carrier": 1, "stats": {}}
    lost = {"iface": "eth1", "operstate": "down", "carrier": 0, "stats": {}}
    admin = {"iface": "eth2", "operstate": "down", "carrier": None, "stats": {}}
    assert _run("net_eth_links", {"net_ifaces": [up, admin]}).status is Status.OK
    assert _run("net_eth_links", {"net_ifaces": [up, lost]}).status is Status.WARN
    res = _run("net_eth_links", {"net_ifaces": [up, lost]}, required=["eth1"])
    assert res.status is Status.FAIL and "eth1" in res.reason
    assert _run("net_eth_links", {"net_ifaces": [up]}, required=["ib0"]).status is Status.FAIL


def test_error_counters_shown_as_evidence():
    assert network.iface_errors({"stats": {"rx_errors": 4, "rx_bytes": 9}}) == {"rx_errors": 4}
