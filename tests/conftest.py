"""Shared fixtures.

``minicluster``: the real Slurm mini-cluster, started once per pytest session (a no-op
when it already runs) and stopped at the end only if this session started it, unless
``SLURM_ROBUST_KEEP_CLUSTER=1``. ``SLURM_ROBUST_TEST_NETNS=1`` brings it up with each
node in its own network namespace (``cluster up --netns``). Integration tests are
marked ``integration``; run only unit tests with ``-m "not integration"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from slurm_robust.cluster.config import ClusterConfig
from slurm_robust.cluster.manager import MiniCluster
from slurm_robust.slurm import Slurm


@dataclass(frozen=True)
class RunningCluster:
    """What an integration test gets: the config, the access layer, the env for commands."""

    cfg: ClusterConfig
    slurm: Slurm
    env: dict[str, str]


@pytest.fixture(scope="session")
def minicluster() -> Iterator[RunningCluster]:
    mc = MiniCluster(ClusterConfig(netns=os.environ.get("SLURM_ROBUST_TEST_NETNS") == "1"))
    was_up = bool(mc.status()["up"])
    mc.up()
    env = dict(os.environ, **mc.cfg.env())
    yield RunningCluster(mc.cfg, Slurm(mc.cfg.env()), env)
    if not was_up and os.environ.get("SLURM_ROBUST_KEEP_CLUSTER") != "1":
        mc.down()


@pytest.fixture(autouse=True)
def _our_drains_resumed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each cluster test starts with every node slurm_robust drained back in service.

    Tests blame nodes on purpose; a verdict applied at a job's end (EpilogSlurmctld, after
    the test's own teardown), a deep check still pending, or the repeat-offender rule
    (the same node blamed twice within hours, which a test suite does by design) would
    otherwise leave the next test's allocation pending. An admin's drain (another reason)
    is left alone: the tests that set one clean up themselves.

    The partitions go back to the cluster's layout too: a requeue onto the reserve moves
    a spare into ``train`` (as it should), and a later test that counts on the layout
    (srun over ``train``, a handoff that moves spare2 itself) would otherwise get it.
    """
    if "minicluster" not in request.fixturenames:
        yield
        return
    cluster: RunningCluster = request.getfixturevalue("minicluster")
    # The previous test's jobs first: EpilogSlurmctld applies their verdicts while they
    # complete, after that test's teardown (a resume before would be undone).
    deadline = time.monotonic() + 90.0
    while time.monotonic() < deadline and any(not j.finished
                                              for j in cluster.slurm.jobs()):
        time.sleep(1.0)
    for node in cluster.slurm.nodes():
        if node.drained and (node.reason or "").startswith("slurm_robust:"):
            cluster.slurm.resume(node.name)
    for part, nodes in (("train", cluster.cfg.train_nodes),
                        ("standby", cluster.cfg.spare_nodes)):
        if sorted(cluster.slurm.partition_nodes(part)) != sorted(nodes):
            cluster.slurm.set_partition_nodes(part, list(nodes))
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses the mini-cluster is an integration test, marked or not: the
    quick subset (``-m "not integration"``) must never start a cluster."""
    for item in items:
        if "minicluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
