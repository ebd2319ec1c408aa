"""Shared fixtures.

``minicluster``: the real Slurm mini-cluster, started once per pytest session (a no-op
when it already runs) and stopped at the end only if this session started it, unless
``SLURM_ROBUST_KEEP_CLUSTER=1``. It comes up as ``cluster up`` does with no mode named:
each node in its own network namespace where they can be made (root, iproute2), else on
the shared network; ``SLURM_ROBUST_TEST_NETNS=1`` insists on namespaces (an error where
they cannot be made) and ``=0`` asks for the shared network. Integration tests are
marked ``integration``; run only unit tests with ``-m "not integration"``.

A cluster that cannot run a trivial job on every node fails the fixture, with the
cluster's diagnosis, so every integration test errors at once instead of each one
waiting out its timeouts. After ``SLURM_ROBUST_TEST_BREAKER`` (default 3; 0 turns it
off) integration tests fail in a row, the smoke job runs again; if it fails, the session
stops there with the diagnosis. A failed integration test's report carries the nodes
that take no jobs and why.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from slurm_robust.health import ledger_writer
from slurm_robust.health.ledger_writer import record_safely
from slurm_robust.health.node_ledger import EventKind, LedgerConfig, NodeEvent
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import Slurm
from slurm_robust.slurm.runner import SlurmCommandError
from slurm_robust_rehearsal.cluster import netns
from slurm_robust_rehearsal.cluster.config import CLUSTER_DIR_ENV, REPO_ROOT, ClusterConfig
from slurm_robust_rehearsal.cluster.manager import MiniCluster, choose_network
from tests.cluster_smoke import diagnosis, smoke
from tests.timing import CLUSTER_SETUP_PROPERTY, TimingSummary


@dataclass(frozen=True)
class RunningCluster:
    """What an integration test gets: the config, the access layer, the env for commands."""

    cfg: ClusterConfig
    slurm: Slurm
    env: dict[str, str]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimingSummary(), "slurm_robust_timing")


def worker_index() -> int:
    """This pytest process's number among pytest-xdist's workers (gw0, gw1, ...; 0 when
    the suite runs in one process)."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


# Worker k > 0 has a cluster of its own (ClusterConfig.sibling): its root goes into the
# environment before any test imports, so that code building ClusterConfig() in this
# process or in the commands it runs (inject, revive_node) finds that cluster.
SESSION_BASE = ClusterConfig().sibling(worker_index())
if worker_index() > 0:
    os.environ[CLUSTER_DIR_ENV] = str(SESSION_BASE.root)

# Held while a worker brings its cluster up: two `up`s at once would race on the host's
# users and packages (each cluster's own files and ports are apart).
UP_LOCK = REPO_ROOT / ".minicluster-up.lock"


@pytest.fixture(scope="session")
def minicluster() -> Iterator[RunningCluster]:
    started = time.monotonic()
    mc = MiniCluster(session_cluster_config())
    was_up = bool(mc.status()["up"])
    with open(UP_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mc.up()
    env = dict(os.environ, **mc.cfg.env())
    cluster = RunningCluster(mc.cfg, Slurm(mc.cfg.env()), env)
    restore_layout(cluster)
    resume_leftovers(cluster)
    problems = smoke(cluster)
    if problems:
        # Cached by pytest: every integration test errors with this at once (the breaker
        # stays off, so the unit tests still run).
        raise RuntimeError("the mini-cluster does not run a trivial job on every node: "
                           + "; ".join(problems) + "\n" + diagnosis(cluster, mc))
    _BREAKER.update(cluster=cluster, mc=mc)
    _SETUP_S["pending"] = time.monotonic() - started
    yield cluster
    _BREAKER.update(cluster=None, mc=None)
    if not was_up and os.environ.get("SLURM_ROBUST_KEEP_CLUSTER") != "1":
        mc.down()


def session_cluster_config() -> ClusterConfig:
    """The session cluster's config: the network mode as the module docstring says, and
    for pytest-xdist worker k > 0 the k-th sibling cluster (its own root, ports, subnet
    and job ids). Siblings need namespaces: on the shared network their jobs' controller,
    rendezvous and metrics ports would meet on 127.0.0.1."""
    base = SESSION_BASE
    asked = os.environ.get("SLURM_ROBUST_TEST_NETNS", "")
    if asked == "0":
        cfg, notice = replace(base, netns=False), None
    elif asked == "1":
        why = netns.unavailable_reason()
        if why is not None:
            raise RuntimeError(f"SLURM_ROBUST_TEST_NETNS=1 but {why}")
        cfg, notice = replace(base, netns=True), None
    else:
        cfg, notice = choose_network(base)
    if worker_index() > 0 and not cfg.netns:
        raise RuntimeError("integration tests in several pytest-xdist workers need network "
                           "namespaces (root, iproute2): run them without -n")
    if notice:
        print(notice)
    return cfg


@pytest.fixture(autouse=True)
def _node_ledger_in_tmp(request: pytest.FixtureRequest,
                        monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unit tests run the prolog, deep-check and verdict paths as root with site configs
    that leave the node ledger at its default (/var/lib/slurm_robust/ledger): it goes to
    the test's tmp directory instead, never into the machine's."""
    if "minicluster" in request.fixturenames:
        yield
        return
    real = ledger_writer.site_ledger_config
    tmp = request.getfixturevalue("tmp_path_factory").mktemp("ledger")

    def in_tmp(site: Any = None) -> LedgerConfig:
        cfg = real(site)
        if cfg.dir == LedgerConfig().dir:
            cfg = replace(cfg, dir=str(tmp / "ledger"), lemons_file=cfg.lemons_file
                          or str(tmp / "lemons.json"))
        return cfg

    monkeypatch.setattr(ledger_writer, "site_ledger_config", in_tmp)
    yield


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
    restore_layout(request.getfixturevalue("minicluster"))
    if "pending" in _SETUP_S:
        # The timing summary runs where the reports go (with pytest-xdist: the controller,
        # not this worker): the set-up travels in the first cluster test's report.
        request.node.user_properties.append((CLUSTER_SETUP_PROPERTY, _SETUP_S.pop("pending")))
    yield


def restore_layout(cluster: RunningCluster) -> None:
    # The previous test's jobs first: EpilogSlurmctld applies their verdicts while they
    # complete, after that test's teardown (a resume before would be undone).
    deadline = time.monotonic() + 90.0
    # Polled every 0.2 s: the wait is on every cluster test's path (a job ends within
    # seconds of its run's end), and a 1 s poll added half a second to each on average.
    while time.monotonic() < deadline and any(not j.finished
                                              for j in cluster.slurm.jobs()):
        time.sleep(0.2)
    for node in cluster.slurm.nodes():
        if node.drained and (node.reason or "").startswith("slurm_robust:"):
            cluster.slurm.resume(node.name)
    for part, nodes in (("train", cluster.cfg.train_nodes),
                        ("standby", cluster.cfg.spare_nodes)):
        if sorted(cluster.slurm.partition_nodes(part)) != sorted(nodes):
            cluster.slurm.set_partition_nodes(part, list(nodes))
    pardon_all(cluster)


def resume_leftovers(cluster: RunningCluster) -> None:
    """Resume the nodes that start the session drained or down for any reason: Slurm's
    saved state outlives `cluster down`, so a developer's cluster keeps what an earlier run
    or bench left (a "Kill task failed" drain after a kill-node). A node that is really
    broken fails the smoke job right after, with the diagnosis."""
    left = [n for n in cluster.slurm.nodes() if n.drained or n.state == "down"]
    for node in left:
        try:
            cluster.slurm.resume(node.name)
        except SlurmCommandError as exc:  # the smoke job reports the node next
            print(f"mini-cluster: {node.name} could not be resumed: {exc}")
    if left:
        print("mini-cluster: resumed nodes an earlier run left out of service: "
              + ", ".join(f"{n.name} ({n.reason or n.state})" for n in left))


def pardon_all(cluster: RunningCluster) -> None:
    """Every node starts a test with a clean lemon record: tests blame nodes by design,
    and three tests blaming one node would make it a lemon that later submissions skip."""
    site = load_site_config(cluster.cfg.robust_conf)
    names = [n.name for n in cluster.slurm.nodes()]
    record_safely([NodeEvent(n, EventKind.PARDON, "test suite") for n in names], site)


# This worker's cluster set-up time until a test's report carries it.
_SETUP_S: dict[str, float] = {}

# The session's cluster (set by the fixture) and the integration failures in a row.
_BREAKER: dict[str, Any] = {"cluster": None, "mc": None, "failed_in_row": 0}


def _breaker_limit() -> int:
    try:
        return int(os.environ.get("SLURM_ROBUST_TEST_BREAKER", "3"))
    except ValueError:
        return 3


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if "integration" not in item.keywords or report.when == "teardown":
        return
    if report.failed:
        _BREAKER["failed_in_row"] += 1
        cluster = _BREAKER["cluster"]
        if cluster is not None:
            report.sections.append(("mini-cluster", diagnosis(cluster, _BREAKER["mc"])))
    elif report.when == "call" and report.passed:
        _BREAKER["failed_in_row"] = 0


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    limit = _breaker_limit()
    cluster = _BREAKER["cluster"]
    if not limit or cluster is None or _BREAKER["failed_in_row"] < limit:
        return
    _BREAKER["failed_in_row"] = 0
    try:
        restore_layout(cluster)
        problems = smoke(cluster)
    except Exception as exc:  # noqa: BLE001 -- a cluster that cannot be asked is broken
        problems = [f"smoke job not run: {exc}"]
    if problems:
        text = diagnosis(cluster, _BREAKER["mc"])
        reporter = item.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "mini-cluster broken: stopping")
            reporter.write_line("; ".join(problems))
            reporter.write_line(text)
        item.session.shouldstop = (f"{limit} integration tests failed in a row and the "
                                   "mini-cluster no longer runs a trivial job on every "
                                   "node: " + "; ".join(problems)[:500])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses the mini-cluster is an integration test, marked or not: the
    quick subset (``-m "not integration"``) must never start a cluster."""
    for item in items:
        if "minicluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
    items.sort(key=module_rank)


# The integration modules with the most cluster time, longest first (seconds in a
# two-worker run, 2026-12-05). pytest-xdist's --dist loadfile with --no-loadscope-reorder
# (make test) hands out modules in collection order, one to each worker as it frees up
# (it would otherwise sort them by test count): longest first, the two workers end
# within seconds of each other (alphabetical order left one with 100 s more to run). A
# stale order costs only balance; the timing summary shows a module that grew.
LONGEST_MODULES = (
    "test_launcher_faults.py",       # 383 s
    "test_plain_scripts.py",         # 197
    "test_hot_update_cluster.py",    # 177
    "test_two_nodes_lost.py",        # 157
    "test_nan_ladder.py",            # 153
    "test_trainer_callbacks.py",     # 146
    "test_preemption.py",            # 125
    "test_reserve_shortfall.py",     # 122
    "test_time_limit.py",            # 110 (195 before its requeues skipped Slurm's hold)
    "test_launcher_monitor.py",      # 96
    "test_controller_failover.py",   # 82
    "test_launcher_executor.py",     # 64
    "test_deep_check_on_node.py",    # 64
    "test_phase_hangs.py",           # 62
    "test_ddp_port.py",              # 53
    "test_slurmctld_outage.py",      # 48
    "test_health_cluster.py",        # 46
)
# Restarts its worker's cluster: after everything else that worker runs.
LAST_MODULE = "test_zz_cluster_lifecycle.py"


def module_rank(item: pytest.Item) -> int:
    """Sort key: the longest integration modules first, in LONGEST_MODULES' order, then
    every other module in its collected order (the sort is stable), the lifecycle test
    last. Unit tests keep their order."""
    name = item.path.name
    if name == LAST_MODULE:
        return len(LONGEST_MODULES) + 1
    try:
        return LONGEST_MODULES.index(name)
    except ValueError:
        return len(LONGEST_MODULES)
