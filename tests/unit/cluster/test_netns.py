"""The namespaced mini-cluster's network: names, addresses, configs, create and destroy."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
from pathlib import Path

import pytest

from slurm_robust_rehearsal.cluster import netns
from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.cluster.daemons import ClusterError
from slurm_robust_rehearsal.cluster.manager import REAPER, MiniCluster
from slurm_robust_rehearsal.cluster.templates import render_slurm_conf


def _cfg(tmp_path: Path, **kw) -> ClusterConfig:
    return ClusterConfig(root=tmp_path / "mc", **kw)


def test_shared_mode_is_the_default_and_stays_on_loopback(tmp_path):
    cfg = _cfg(tmp_path)
    assert cfg.netns is False
    text = render_slurm_conf(cfg, {})
    assert "SlurmctldHost=localhost\n" in text
    assert "AccountingStorageHost=localhost\n" in text
    assert "NodeAddr=127.0.0.1 Port=17002" in text
    assert netns.exec_prefix(cfg, "node2") == ()
    assert MiniCluster(cfg).daemon("slurmd-node2").argv == (
        cfg.python, str(REAPER), "slurmd", "-D", "-N", "node2")


def test_netns_mode_gives_each_node_its_address_and_the_bridge_the_control_plane(tmp_path):
    cfg = _cfg(tmp_path, netns=True)
    text = render_slurm_conf(cfg, {})
    assert "SlurmctldHost=localhost(10.213.0.1)\n" in text
    assert "AccountingStorageHost=10.213.0.1\n" in text
    assert "NodeName=node1 NodeHostname=node1 NodeAddr=10.213.0.11 Port=17001" in text
    assert "NodeName=spare2 NodeHostname=spare2 NodeAddr=10.213.0.16 Port=17006" in text
    p = netns.plan(cfg)
    assert p.bridge == p.prefix + "br" and p.gateway == "10.213.0.1"
    names = [n.host_if for n in p.nodes] + [p.bridge]
    assert all(len(name) <= 15 for name in names)  # the kernel's interface name limit
    assert len(set(names)) == len(names)
    argv = MiniCluster(cfg).daemon("slurmd-node2").argv
    assert argv[:2] == ("nsenter", f"--net=/run/netns/{p.prefix}-node2")
    assert argv[-4:] == ("slurmd", "-D", "-N", "node2")
    # Its own hostname, the NodeHostname slurmctld looks an srun's reported host up by.
    assert "--uts" in argv and argv[argv.index(cfg.python) - 1] == "node2"


def test_prefix_differs_per_cluster_root(tmp_path):
    assert netns.prefix_of(_cfg(tmp_path / "a")) != netns.prefix_of(_cfg(tmp_path / "b"))


def test_mode_is_remembered_with_the_shape(tmp_path):
    cfg = _cfg(tmp_path, netns=True)
    assert cfg.saved_netns() is None
    cfg.etc.mkdir(parents=True)
    cfg.save_shape()
    assert _cfg(tmp_path).with_saved_shape().netns is True
    assert _cfg(tmp_path).saved_netns() is True


def test_hosts_file_maps_this_host_to_the_nodes_own_address(tmp_path):
    cfg = _cfg(tmp_path, netns=True)
    p = netns.plan(cfg)
    text = netns.hosts_file(cfg, p.node("node3"), p)
    assert f"10.213.0.13 {socket.gethostname()}\n" in text
    assert "10.213.0.11 node1\n" in text and "127.0.0.1 localhost\n" in text


def test_network_faults_need_the_namespaced_cluster(tmp_path):
    with pytest.raises(ClusterError, match="cluster up --netns"):
        netns.set_link(_cfg(tmp_path), "node2", up=False)


@pytest.mark.skipif(netns.unavailable_reason() is not None,
                    reason=f"no network namespaces: {netns.unavailable_reason()}")
def test_create_is_idempotent_and_destroy_removes_everything_by_name(tmp_path):
    # A subnet of its own, so a mini-cluster that runs meanwhile is not touched.
    cfg = _cfg(tmp_path, netns=True, netns_subnet="10.214.7.0/24").sized(2, 1)
    p = netns.plan(cfg)
    try:
        netns.create(cfg)
        netns.create(cfg)  # idempotent
        inside = subprocess.run(["ip", "-n", p.node("node2").netns, "-o", "-4", "addr"],
                                capture_output=True, text=True, check=True).stdout
        assert "10.214.7.12/24" in inside
        assert netns.link_is_up(cfg, "node2")
        netns.set_link(cfg, "node2", up=False)
        assert not netns.link_is_up(cfg, "node2")
        netns.set_link(cfg, "node2", up=True)
        assert netns.link_is_up(cfg, "node2")
        # A process left inside a namespace (as after a crash) does not keep it alive.
        subprocess.Popen(["ip", "netns", "exec", p.node("node1").netns, "sleep", "300"])
    finally:
        removed = netns.destroy(cfg)
    assert f"bridge {p.bridge}" in removed
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert p.prefix not in left
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert p.prefix not in links
    assert not list(netns.NETNS_ETC.glob(p.prefix + "-*"))


def test_subnet_pick_skips_every_taken_24_and_keeps_an_existing_bridges_own():
    import ipaddress
    cfg = ClusterConfig(root=Path("/nonexistent/mc"), netns=True, netns_subnet="10.213.0.0/24")
    iface = ipaddress.IPv4Interface
    used = [("eth0", iface("192.0.2.2/24")), ("srdeadbr", iface("10.213.0.1/24")),
            ("wg0", iface("10.213.1.7/32"))]
    assert netns._pick_subnet(cfg, "srmineb", used) == "10.213.2.0/24"
    assert netns._pick_subnet(cfg, "srmineb", [("eth0", iface("192.0.2.2/24"))]) \
        == "10.213.0.0/24"
    # This cluster's bridge is up already (a second `up`): its subnet stays, whatever
    # is free, since its slurmds hold addresses on it.
    mine = used + [("srminebr", iface("10.213.5.1/24"))]
    assert netns._pick_subnet(cfg, "srminebr", mine) == "10.213.5.0/24"
    crowded = [(f"x{k}", iface(f"10.213.{k}.1/24")) for k in range(netns.SUBNET_TRIES)]
    with pytest.raises(ClusterError, match="no free /24 from 10.213.0.0/24"):
        netns._pick_subnet(cfg, "srminebr", crowded)


@pytest.mark.skipif(netns.unavailable_reason() is not None,
                    reason=f"no network namespaces: {netns.unavailable_reason()}")
def test_a_stale_bridge_on_the_default_subnet_does_not_stop_up(tmp_path):
    """The host's network outlives processes: a run killed before its `down` leaves its
    bridge and namespaces, and the next `up` (a CI run, another checkout) must take
    another subnet rather than fail, and say so."""
    stale = _cfg(tmp_path / "dead", netns=True, netns_subnet="10.214.20.0/24").sized(1, 0)
    fresh = _cfg(tmp_path / "new", netns=True, netns_subnet="10.214.20.0/24").sized(2, 0)
    try:
        netns.create(stale)
        subnet, notice = netns.free_subnet(fresh)
        assert subnet == "10.214.21.0/24"
        assert notice == (f"mini-cluster: bridge subnet 10.214.21.0/24 (10.214.20.0/24 is "
                          f"used by {netns.plan(stale).bridge})")
        moved = dataclasses.replace(fresh, netns_subnet=subnet)
        netns.create(moved)
        inside = subprocess.run(["ip", "-n", netns.plan(moved).node("node2").netns, "-o",
                                 "-4", "addr"], capture_output=True, text=True,
                                check=True).stdout
        assert "10.214.21.12/24" in inside
        # Asked again (a second `up` of the same root), it keeps its own bridge's subnet.
        assert netns.free_subnet(fresh)[0] == "10.214.21.0/24"
    finally:
        netns.destroy(fresh)
        netns.destroy(stale)


def test_inject_network_faults_check_their_arguments(tmp_path, monkeypatch):
    from slurm_robust.launcher.errors import InjectionError
    from slurm_robust_rehearsal.inject.network_cli import apply

    monkeypatch.setenv("SLURM_ROBUST_CLUSTER_DIR", str(tmp_path / "mc"))
    with pytest.raises(InjectionError, match="no node 'node9'"):
        apply("partition", "node9")
    with pytest.raises(InjectionError, match="--delay-ms"):
        apply("link-slow", "node2")
    with pytest.raises(InjectionError, match="cluster up --netns"):
        apply("partition", "node2")  # the cluster in that root is in shared mode


def test_up_without_a_mode_is_namespaced_where_namespaces_can_be_made(tmp_path, monkeypatch):
    from slurm_robust_rehearsal.cluster.manager import choose_network

    monkeypatch.setattr(netns, "unavailable_reason", lambda: None)
    cfg, notice = choose_network(_cfg(tmp_path))
    assert cfg.netns is True and notice is None


def test_up_without_a_mode_falls_back_to_the_shared_network_and_says_why(tmp_path,
                                                                          monkeypatch):
    from slurm_robust_rehearsal.cluster.manager import choose_network

    monkeypatch.setattr(netns, "unavailable_reason", lambda: "`ip` (iproute2) is not installed")
    cfg, notice = choose_network(_cfg(tmp_path, netns=True))
    assert cfg.netns is False
    assert notice is not None and "\n" not in notice
    assert "shared network" in notice and "iproute2" in notice


def test_sibling_clusters_authenticate_to_their_own_slurmdbd(tmp_path):
    # Connections to slurmdbd take munge's socket from AccountingStoragePass, else from
    # munge's compiled-in path, which one host can point at one cluster only.
    first = _cfg(tmp_path, netns=True)
    second = first.sibling(1)
    texts = [render_slurm_conf(c, {}) for c in (first, second)]
    for cfg, text in zip((first, second), texts, strict=True):
        assert f"AccountingStoragePass={cfg.munge_socket}\n" in text
        assert f"AuthInfo=socket={cfg.munge_socket}," in text
    assert first.munge_socket != second.munge_socket
    assert first.dbd_port != second.dbd_port and first.root != second.root
