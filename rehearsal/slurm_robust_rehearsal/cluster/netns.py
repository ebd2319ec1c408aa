"""Per-node network namespaces for the mini-cluster (``cluster up --netns``).

Each node gets a network namespace of its own, joined to one bridge in the host's
namespace by a veth pair: the host end (``<prefix>v<i>``) is a bridge port, the node end
is ``eth0`` inside the namespace with the node's address (``ClusterConfig.node_addr``).
The bridge carries the control plane's address (``ClusterConfig.control_addr``), so
slurmctld and slurmdbd, which stay in the host namespace, are reached from every node
over a real interface. A node's slurmd runs in the node's namespace, so its slurmstepds,
the job's agents and workers live in the node's namespace too.

What runs in a node (:func:`exec_prefix`) has the node's name as its hostname (a UTS
namespace) and sees ``/etc/netns/<ns>/hosts`` bind-mounted over ``/etc/hosts`` (as
``ip netns exec`` would do); that file maps the node's name and this host's name to the
node's own address (so a process asking "what is my address" inside the node gets the
node's, as on a real cluster) and every node name to its address. slurm.conf names each
node's hostname the same (``NodeHostname=<node>``): slurmctld finds an srun's address by
looking the short hostname srun reports up among the NodeHostnames (their NodeAddr), and
only then through the resolver of its own namespace, where a node's name means nothing.
With the host's name in every node, a node-failure message for an srun on a node went
to the host, and an srun waiting on a lost node's tasks never ended.

Every object is named from a short hash of the cluster root (``<prefix>``), so ``down``
finds and removes all of them from the names alone, even after a crash lost any record.
A node's link can be cut (:func:`set_link`, the ``partition`` fault: packets dropped, the
processes alive) or delayed (:func:`set_delay`, tc netem).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from slurm_robust_rehearsal.cluster.config import ClusterConfig
from slurm_robust_rehearsal.cluster.daemons import ClusterError

log = logging.getLogger("slurm_robust_rehearsal.cluster")

NETNS_ETC = Path("/etc/netns")
IP_TIMEOUT_S = 15
# How many /24s after the configured one `up` tries before giving up.
SUBNET_TRIES = 64
#: The interface name inside each node's namespace.
NODE_IF = "eth0"


@dataclass(frozen=True)
class NodeNet:
    """One node's piece of the network."""

    node: str
    netns: str
    host_if: str
    addr: str


@dataclass(frozen=True)
class NetPlan:
    """Every name and address the namespaced mini-cluster uses."""

    prefix: str
    bridge: str
    gateway: str
    prefixlen: int
    nodes: tuple[NodeNet, ...]

    def node(self, name: str) -> NodeNet:
        for n in self.nodes:
            if n.node == name:
                return n
        raise ClusterError(f"no node {name!r} in the mini-cluster "
                           f"(nodes: {', '.join(n.node for n in self.nodes)})")


def prefix_of(cfg: ClusterConfig) -> str:
    """``sr`` + 4 hex digits of the cluster root: short enough for interface names
    (15 characters) and distinct per cluster directory."""
    return "sr" + hashlib.sha1(str(cfg.root).encode()).hexdigest()[:4]


def plan(cfg: ClusterConfig) -> NetPlan:
    p = prefix_of(cfg)
    nodes = tuple(NodeNet(node, f"{p}-{node}", f"{p}v{i + 1}", cfg.node_addr(node))
                  for i, node in enumerate(cfg.nodes))
    net = ipaddress.ip_network(cfg.netns_subnet)
    return NetPlan(p, f"{p}br", cfg.control_addr, net.prefixlen, nodes)


def exec_prefix(cfg: ClusterConfig, node: str) -> tuple[str, ...]:
    """argv prefix that runs a command inside ``node``'s namespace (empty in shared mode).

    Not ``ip netns exec``: it remounts /sys, which loses the cgroup mounts slurmd needs.
    The network namespace alone (nsenter) plus a private mount namespace (unshare) in
    which the node's hosts file covers /etc/hosts; the command is exec'd, so its pid
    is the one started (the pid file stays right)."""
    if not cfg.netns:
        return ()
    ns = plan(cfg).node(node).netns
    return ("nsenter", f"--net=/run/netns/{ns}", "unshare", "--mount", "--uts",
            "--propagation", "private", "sh", "-c",
            'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"',
            str(NETNS_ETC / ns / "hosts"), node)


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True,
                              timeout=IP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise ClusterError(f"`{argv[0]}` not found: the namespaced mini-cluster needs "
                           "iproute2 (apt-get install iproute2)") from exc
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()[-300:]}")
    return proc


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run `cluster up --netns` as root)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"srprobe{os.getpid() % 100000}"
    made = _ip("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()[-200:]}"
    _ip("ip", "netns", "del", probe, check=False)
    return None


def _links() -> set[str]:
    out = _ip("ip", "-o", "link", "show").stdout
    names = set()
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.add(parts[1].strip().split("@", 1)[0])
    return names


def _namespaces() -> set[str]:
    out = _ip("ip", "netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _ipv4_addresses() -> list[tuple[str, ipaddress.IPv4Interface]]:
    """(interface, address) for every IPv4 address in this network namespace."""
    found = []
    for line in _ip("ip", "-o", "-4", "addr", "show").stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            found.append((parts[1], ipaddress.IPv4Interface(parts[3])))
    return found


def free_subnet(cfg: ClusterConfig) -> tuple[str, str | None]:
    """The /24 this cluster's bridge should use, and a one-line notice when it is not
    ``cfg.netns_subnet``.

    A bridge this cluster already has keeps its subnet. Otherwise the configured one,
    or the first /24 after it that no interface uses: the host's network outlives
    processes, so another cluster's bridge (a sibling, a second checkout, or one left by
    a run killed before its ``down``) may hold the default, and a clash must not stop
    ``up``. The subnet taken is written to the cluster's shape file, which every later
    command reads."""
    used = _ipv4_addresses()
    chosen = _pick_subnet(cfg, plan(cfg).bridge, used)
    if chosen == cfg.netns_subnet:
        return chosen, None
    wanted = ipaddress.IPv4Network(cfg.netns_subnet)
    taken = sorted({name for name, addr in used if addr.network.overlaps(wanted)})
    why = f"is used by {', '.join(taken)}" if taken else "is not this cluster's bridge's"
    return chosen, f"mini-cluster: bridge subnet {chosen} ({cfg.netns_subnet} {why})"


def _pick_subnet(cfg: ClusterConfig, bridge: str,
                 used: list[tuple[str, ipaddress.IPv4Interface]]) -> str:
    for name, addr in used:
        if name == bridge:
            return str(addr.network)
    first = ipaddress.IPv4Network(cfg.netns_subnet)
    for k in range(SUBNET_TRIES):
        candidate = ipaddress.IPv4Network((int(first.network_address) + 256 * k, 24))
        if not candidate.is_private:
            break
        if not any(addr.network.overlaps(candidate) for _, addr in used):
            return str(candidate)
    raise ClusterError(f"no free /24 from {cfg.netns_subnet} on: the next {SUBNET_TRIES} "
                       "are all used by interfaces (`ip -4 addr`); remove stale ones "
                       "(`slurm-robust cluster down --dir DIR` for a dead mini-cluster) "
                       "or set another netns_subnet")


def _check_subnet_free(p: NetPlan) -> None:
    """Refuse a subnet another interface already uses (a route clash would send the
    cluster's traffic elsewhere)."""
    net = ipaddress.ip_network(f"{p.gateway}/{p.prefixlen}", strict=False)
    for name, addr in _ipv4_addresses():
        if name != p.bridge and addr.network.overlaps(net):
            raise ClusterError(f"subnet {net} is already used by {name} ({addr}); "
                               "give the mini-cluster another netns_subnet")


def hosts_file(cfg: ClusterConfig, node: NodeNet, p: NetPlan) -> str:
    lines = ["# Generated by `slurm-robust cluster up --netns`; removed by `cluster down`.",
             "127.0.0.1 localhost",
             # This host's own name is the node's address inside the node, so that
             # "my address" (gethostbyname(gethostname())) is the one peers reach.
             f"{node.addr} {socket.gethostname()}"]
    lines += [f"{n.addr} {n.node}" for n in p.nodes]
    return "\n".join(lines) + "\n"


def create(cfg: ClusterConfig) -> NetPlan:
    """Create the bridge, the namespaces and veth pairs (idempotent: what exists stays)."""
    p = plan(cfg)
    links = _links()
    if p.bridge not in links:
        _check_subnet_free(p)
        _ip("ip", "link", "add", p.bridge, "type", "bridge")
    addrs = _ip("ip", "-o", "-4", "addr", "show", "dev", p.bridge).stdout
    if f" {p.gateway}/" not in addrs:
        _ip("ip", "addr", "add", f"{p.gateway}/{p.prefixlen}", "dev", p.bridge)
    _ip("ip", "link", "set", p.bridge, "up")
    have = _namespaces()
    for n in p.nodes:
        if n.netns not in have:
            _ip("ip", "netns", "add", n.netns)
        if n.host_if not in links:
            # Created with a temporary peer name in the host namespace, then moved in
            # and renamed: two nodes' peers would clash as "eth0" in the host namespace.
            peer = f"{n.host_if}p"
            _ip("ip", "link", "add", n.host_if, "type", "veth", "peer", "name", peer)
            _ip("ip", "link", "set", peer, "netns", n.netns)
            _ip("ip", "-n", n.netns, "link", "set", peer, "name", NODE_IF)
        _ip("ip", "link", "set", n.host_if, "master", p.bridge)
        _ip("ip", "link", "set", n.host_if, "up")
        inside = _ip("ip", "-n", n.netns, "-o", "-4", "addr", "show", "dev", NODE_IF).stdout
        if f" {n.addr}/" not in inside:
            _ip("ip", "-n", n.netns, "addr", "add", f"{n.addr}/{p.prefixlen}", "dev", NODE_IF)
        _ip("ip", "-n", n.netns, "link", "set", NODE_IF, "up")
        _ip("ip", "-n", n.netns, "link", "set", "lo", "up")
        etc = NETNS_ETC / n.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file(cfg, n, p))
    return p


def destroy(cfg: ClusterConfig) -> list[str]:
    """Remove every namespace, veth and bridge of this cluster (by name prefix, so it
    works after a crash) and stop what still runs inside; returns what was removed."""
    if shutil.which("ip") is None:
        return []
    p = plan(cfg)
    removed: list[str] = []
    ours = sorted(ns for ns in _namespaces() if ns.startswith(p.prefix + "-"))
    for ns in ours:
        # Processes left in our namespace are ours (nothing else is started there):
        # a job process slurmd's stop did not reach would keep the namespace alive.
        _kill_inside(ns)
        _ip("ip", "netns", "del", ns, check=False)
        removed.append(f"netns {ns}")
    for link in sorted(_links()):
        if link.startswith(p.prefix) and link != p.bridge:
            if _ip("ip", "link", "del", link, check=False).returncode == 0:
                removed.append(f"link {link}")
    if p.bridge in _links():
        _ip("ip", "link", "del", p.bridge, check=False)
        removed.append(f"bridge {p.bridge}")
    if NETNS_ETC.is_dir():
        for d in NETNS_ETC.iterdir():
            if d.name.startswith(p.prefix + "-"):
                shutil.rmtree(d, ignore_errors=True)
    return removed


def _kill_inside(ns: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(x) for x in _ip("ip", "netns", "pids", ns, check=False).stdout.split()
                if x.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _ip("ip", "netns", "pids", ns,
                                                  check=False).stdout.split():
            time.sleep(0.1)


def _need_netns(cfg: ClusterConfig) -> NetPlan:
    hint = "`slurm-robust cluster down` then `slurm-robust cluster up --netns`"
    if not cfg.netns:
        raise ClusterError(f"network faults need the namespaced mini-cluster: {hint}")
    p = plan(cfg)
    if p.bridge not in _links():
        raise ClusterError(f"the namespaced mini-cluster is not up (no bridge {p.bridge}): "
                           f"{hint}")
    return p


def set_link(cfg: ClusterConfig, node: str, up: bool) -> NodeNet:
    """Cut (``up=False``) or restore a node's link. The host end goes down, so the node
    loses carrier: every packet to and from it is dropped, its processes keep running
    and their connections resume when the link returns."""
    n = _need_netns(cfg).node(node)
    _ip("ip", "link", "set", n.host_if, "up" if up else "down")
    return n


def link_is_up(cfg: ClusterConfig, node: str) -> bool:
    n = _need_netns(cfg).node(node)
    out = _ip("ip", "-o", "link", "show", "dev", n.host_if).stdout
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
    return "UP" in flags


def set_delay(cfg: ClusterConfig, node: str, delay_ms: float | None) -> NodeNet:
    """Delay every packet the node sends by ``delay_ms`` (tc netem on its ``eth0``, so
    round trips to it grow by that much); None removes the delay."""
    n = _need_netns(cfg).node(node)
    if shutil.which("tc") is None:
        raise ClusterError("`tc` is not installed (iproute2): apt-get install iproute2")
    base = ("ip", "netns", "exec", n.netns, "tc", "qdisc")
    if delay_ms is None:
        _ip(*base, "del", "dev", NODE_IF, "root", check=False)
        return n
    if delay_ms <= 0:
        raise ClusterError(f"--delay-ms must be > 0, got {delay_ms:g}")
    proc = _ip(*base, "replace", "dev", NODE_IF, "root", "netem", "delay",
               f"{delay_ms:g}ms", check=False)
    if proc.returncode != 0:
        err = proc.stderr.strip()
        if "unknown" in err.lower():
            raise ClusterError("this kernel has no netem qdisc (sch_netem), so links "
                               f"cannot be slowed here: `tc` said: {err[-200:]}")
        raise ClusterError(f"tc netem on {node} failed: {err[-300:]}")
    return n
