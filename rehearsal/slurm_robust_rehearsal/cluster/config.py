"""Where the mini-cluster keeps everything, and which ports and nodes it uses.

One directory holds every config, state, log, pid file and node-local directory, so
``rm -rf`` of it after ``cluster down`` leaves the machine as it was. Node-local paths
carry the node name, so "losing a node" (stop its slurmd, kill its processes, wipe
its directories) is a faithful rehearsal on one host.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

CLUSTER_DIR_ENV = "SLURM_ROBUST_CLUSTER_DIR"
# Set in the environment of every daemon the mini-cluster starts, so that `down` can find
# exactly its own processes (slurmstepd inherits it from slurmd) and nothing else.
MARKER_ENV = "SLURM_ROBUST_MINICLUSTER"

#: The slurm_robust checkout (this file is rehearsal/slurm_robust_rehearsal/cluster/config.py).
REPO_ROOT = Path(__file__).resolve().parents[3]


def default_cluster_dir() -> Path:
    env = os.environ.get(CLUSTER_DIR_ENV)
    return Path(env).resolve() if env else REPO_ROOT / ".minicluster"


@dataclass(frozen=True)
class ClusterConfig:
    """The mini-cluster's shape.

    Attributes:
        root: the one directory holding everything (default ``.minicluster/`` in the checkout,
            or ``$SLURM_ROBUST_CLUSTER_DIR``).
        name: Slurm ClusterName.
        train_nodes: nodes of the default partition ``train``.
        spare_nodes: nodes of the reserve partition ``standby``.
        cpus_per_node: CPUs each node declares (all nodes share this host's cores).
        memory_mb: RealMemory each node declares.
        ctld_port, dbd_port, mysql_port: TCP ports on 127.0.0.1.
        node_port_base: node i (1-based over train then spare nodes) listens on base + i.
        user: the unprivileged account created for tests and demos.
        attacker: a second unprivileged account, the hostile user of the security tests.
        slurm_user: SlurmUser of slurmctld and slurmdbd (Debian's packages create ``slurm``).
        python: interpreter that runs the node programs (prolog, epilog, ...).
        netns: give each node its own network namespace and address on a bridge
            (``cluster up --netns``, see cluster/netns.py); False is the shared-network
            mode (every node on 127.0.0.1), the default for now.
        netns_subnet: the bridge's IPv4 /24: the control plane (slurmctld, slurmdbd) on .1,
            node i (1-based over train then spare nodes) on .10 + i.
        first_job_id: Slurm's FirstJobId. Job ids of two clusters on one host must not
            overlap: the mini-cluster finds a job's processes on a node by its job id and
            node name (``inject kill-node``), and every cluster's nodes are named alike.
    """

    root: Path = field(default_factory=default_cluster_dir)
    name: str = "robust"
    train_nodes: tuple[str, ...] = ("node1", "node2", "node3", "node4")
    spare_nodes: tuple[str, ...] = ("spare1", "spare2")
    cpus_per_node: int = 2
    memory_mb: int = 2048
    ctld_port: int = 16817
    dbd_port: int = 16819
    mysql_port: int = 13306
    node_port_base: int = 17000
    user: str = "robust"
    attacker: str = "mallory"
    slurm_user: str = "slurm"
    python: str = sys.executable
    netns: bool = False
    netns_subnet: str = "10.213.0.0/24"
    first_job_id: int = 1

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.train_nodes + self.spare_nodes

    def node_port(self, node: str) -> int:
        return self.node_port_base + 1 + self.nodes.index(node)

    @property
    def control_addr(self) -> str:
        """Where nodes reach slurmctld and slurmdbd: loopback, or the bridge in netns mode."""
        if not self.netns:
            return "127.0.0.1"
        return self._subnet_host(1)

    def node_addr(self, node: str) -> str:
        """The node's NodeAddr: loopback, or its own address in netns mode."""
        if not self.netns:
            return "127.0.0.1"
        return self._subnet_host(11 + self.nodes.index(node))

    def node_hostname(self, node: str) -> str:
        """The node's NodeHostname: this host's (``localhost``) when the nodes share its
        network, the node's own name in netns mode, where each node has its own hostname
        (cluster/netns.py says why slurmctld needs the two to agree)."""
        return node if self.netns else "localhost"

    def _subnet_host(self, offset: int) -> str:
        net = ipaddress.ip_network(self.netns_subnet)
        if net.prefixlen != 24 or offset >= 255:
            raise ValueError(f"netns_subnet must be a /24 with room for {len(self.nodes)} "
                             f"nodes, got {self.netns_subnet}")
        return str(net.network_address + offset)

    # --- paths -----------------------------------------------------------------------
    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def plugstack_conf(self) -> Path:
        return self.etc / "plugstack.conf"

    @property
    def robust_conf(self) -> Path:
        """slurm_robust's own site config (checks, reserve, injection switch)."""
        return self.etc / "slurm_robust.json"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def ledger_dir(self) -> Path:
        """The node ledger's directory (slurm_robust.json's ``ledger.dir``)."""
        return self.log_dir / "ledger"

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def munge_dir(self) -> Path:
        return self.root / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def mysql_dir(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_socket(self) -> Path:
        return self.mysql_dir / "mysqld.sock"

    @property
    def ctld_state(self) -> Path:
        return self.root / "ctld"

    @property
    def shared_dir(self) -> Path:
        """A directory every node and the unprivileged user can write (like a shared FS)."""
        return self.root / "shared"

    def node_dir(self, node: str) -> Path:
        """Everything node-local for ``node``: spool, tmp, state (health journal), shm."""
        return self.root / "nodes" / node

    @property
    def shape_file(self) -> Path:
        """The node names the last ``up`` used, so later commands see the same cluster."""
        return self.etc / "shape.json"

    def sized(self, nodes: int, spares: int) -> ClusterConfig:
        """This config with ``node1..nodeN`` in ``train`` and ``spare1..spareK`` in
        ``standby``."""
        if nodes < 1 or spares < 0:
            raise ValueError(f"the mini-cluster needs >= 1 node and >= 0 spares, got "
                             f"--nodes {nodes} --spares {spares}")
        return replace(self, train_nodes=tuple(f"node{i}" for i in range(1, nodes + 1)),
                       spare_nodes=tuple(f"spare{i}" for i in range(1, spares + 1)))

    def sibling(self, index: int) -> ClusterConfig:
        """Cluster number ``index`` (0: this one) of several on one host: its own root
        (``<root>-<index>``), ports, bridge subnet and job ids, so that their daemons,
        nodes and jobs never meet (the test suite runs one per pytest worker)."""
        if index == 0:
            return self
        if not 0 < index < 50:
            raise ValueError(f"sibling cluster index must be in 1..49, got {index}")
        net = ipaddress.ip_network(self.netns_subnet)
        subnet = ipaddress.ip_network((int(net.network_address) + 256 * index, 24))
        step = 100 * index
        return replace(self, root=self.root.with_name(f"{self.root.name}-{index}"),
                       ctld_port=self.ctld_port + step, dbd_port=self.dbd_port + step,
                       mysql_port=self.mysql_port + step,
                       node_port_base=self.node_port_base + step,
                       netns_subnet=str(subnet),
                       first_job_id=self.first_job_id + 100_000 * index)

    def save_shape(self) -> None:
        self.shape_file.write_text(json.dumps({
            "version": 1, "train": list(self.train_nodes), "spare": list(self.spare_nodes),
            "netns": self.netns, "ports": {"ctld": self.ctld_port, "dbd": self.dbd_port,
                                           "mysql": self.mysql_port,
                                           "node_base": self.node_port_base},
            "netns_subnet": self.netns_subnet, "first_job_id": self.first_job_id}) + "\n")

    def with_saved_shape(self) -> ClusterConfig:
        """This config with the node names, network mode, ports and job ids of the last
        ``up`` in its root (if any)."""
        try:
            shape = json.loads(self.shape_file.read_text())
        except FileNotFoundError:
            return self
        ports = shape.get("ports", {})
        return replace(self, train_nodes=tuple(shape["train"]),
                       spare_nodes=tuple(shape["spare"]),
                       netns=bool(shape.get("netns", False)),
                       ctld_port=int(ports.get("ctld", self.ctld_port)),
                       dbd_port=int(ports.get("dbd", self.dbd_port)),
                       mysql_port=int(ports.get("mysql", self.mysql_port)),
                       node_port_base=int(ports.get("node_base", self.node_port_base)),
                       netns_subnet=str(shape.get("netns_subnet", self.netns_subnet)),
                       first_job_id=int(shape.get("first_job_id", self.first_job_id)))

    def saved_netns(self) -> bool | None:
        """The network mode the last ``up`` in this root used (None: never up)."""
        try:
            return bool(json.loads(self.shape_file.read_text()).get("netns", False))
        except (FileNotFoundError, ValueError):
            return None

    def env(self) -> dict[str, str]:
        """Environment that points Slurm's commands at this cluster."""
        return {"SLURM_CONF": str(self.slurm_conf), CLUSTER_DIR_ENV: str(self.root),
                "SLURM_ROBUST_CONFIG": str(self.robust_conf)}
