"""The node-side deep check of a pending node and the caller's wait (no cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_robust.health.drain import DEEP_FAILED_PREFIX, PENDING_PREFIX
from slurm_robust.health.probes import inject_path
from slurm_robust.node_deep_check import (
    OUTCOME_FILE,
    deep_check_and_return,
    failed_reason,
)
from slurm_robust.pending_reason import is_pending
from slurm_robust.records import read_records
from slurm_robust.reserve.remote_check import wait_result
from slurm_robust.site_config import SiteConfig

#: The heavy deep checks (matmul, bandwidth, collective, disk I/O) are off: the unit
#: under test is what happens around the suite, not the checks.
LIGHT = {name: {"enabled": False} for name in
         ("deep_matmul", "deep_membw", "deep_collective", "deep_disk_io")}


class FakeSlurm:
    """The two node calls the deep check makes, over a scripted (state, reason) list."""

    def __init__(self, states: list[tuple[str, str]]) -> None:
        self.states = states
        self.calls: list[tuple[str, ...]] = []

    def node_state_reason(self, node: str) -> tuple[str, str]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def resume(self, node: str) -> None:
        self.calls.append(("resume", node))

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", node, reason))


@pytest.fixture()
def site(tmp_path: Path) -> SiteConfig:
    return SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True,
                      checks=LIGHT)


PENDING = ("drained", f"{PENDING_PREFIX} gpu_memory_error from job 7")


def test_reasons() -> None:
    assert is_pending(*PENDING)
    assert not is_pending("idle", PENDING[1])
    assert not is_pending("draining", PENDING[1])  # a job still runs there
    assert not is_pending("drained", "slurm_robust: gpu_xid: Xid 79")
    assert failed_reason("slurm_robust: deep_shm_free: 0 GiB") == \
        f"{DEEP_FAILED_PREFIX} deep_shm_free: 0 GiB"


def test_the_health_check_programs_common_path_imports_no_deep_check_code() -> None:
    """slurmd runs the program on every node every interval: deciding that a node is not
    pending must not import the suite, the repair loop or the ledger (they doubled the
    CPU of each run); the deep check is imported only for a pending node."""
    probe = ("import sys, slurm_robust.health_check_program; "
             "print(' '.join(m for m in sys.modules if m.startswith('slurm_robust.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert "slurm_robust.health_check_program" in out
    heavy = [m for m in out if m.startswith(("slurm_robust.health.", "slurm_robust.stacks"))
             or m in ("slurm_robust.health", "slurm_robust.node_deep_check")]
    assert heavy == [], heavy


def test_a_passing_pending_node_is_resumed_and_recorded(site: SiteConfig) -> None:
    slurm = FakeSlurm([PENDING])
    out = deep_check_and_return("node3", "node3", slurm, site)  # type: ignore[arg-type]
    assert out.passed and out.action == "resumed" and slurm.calls == [("resume", "node3")]
    rec = read_records(site.state_path("node3") / OUTCOME_FILE).records[-1]
    assert rec["schema"] == "slurm_robust.deep_check" and rec["slurmd_node"] == "node3"
    assert rec["run_id"] == out.run_id


def test_a_failing_pending_node_is_drained_naming_the_check(site: SiteConfig) -> None:
    path = inject_path(site.state_path("node3"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"shm_free_bytes": 0}')
    slurm = FakeSlurm([PENDING])
    out = deep_check_and_return("node3", "node3", slurm, site)  # type: ignore[arg-type]
    assert not out.passed and out.action == "drained"
    assert slurm.calls[0][2].startswith(f"{DEEP_FAILED_PREFIX} deep_shm_free:")


def test_a_reason_changed_during_the_suite_is_left_alone(site: SiteConfig) -> None:
    slurm = FakeSlurm([PENDING, ("drained", "admin: ticket 17")])
    out = deep_check_and_return("node3", "node3", slurm, site)  # type: ignore[arg-type]
    assert out.action == "left" and slurm.calls == []


def test_a_node_not_pending_is_not_checked(site: SiteConfig) -> None:
    slurm = FakeSlurm([("idle", "")])
    out = deep_check_and_return("node3", "node3", slurm, site)  # type: ignore[arg-type]
    assert out.action == "left" and out.run_id == "" and slurm.calls == []


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.mark.parametrize(("states", "done", "passed"), [
    ([PENDING, PENDING, ("idle", "")], True, True),
    ([PENDING, ("drained", f"{DEEP_FAILED_PREFIX} deep_shm_free: 0")], True, False),
    ([PENDING, ("drained", "admin: ticket 17")], False, False),
    ([PENDING], False, False),
])
def test_wait_result(states: list[tuple[str, str]], done: bool, passed: bool) -> None:
    clock = Clock()
    res = wait_result(FakeSlurm(states), "node3", 30.0, clock, clock.sleep)  # type: ignore[arg-type]
    assert (res.done, res.passed) == (done, passed)
    assert res.waited_s <= 31.0


@pytest.mark.parametrize(("line", "expected"), [
    ("NodeName=node3 Arch=x86_64 State=IDLE+DRAIN+RESERVED ThreadsPerCore=1 "
     "Reason=slurm_robust: pending deep check: x, expected >= 1 [root@2026-11-30T23:31:27]",
     ("drained", "slurm_robust: pending deep check: x, expected >= 1")),
    ("NodeName=node3 State=MIXED+DRAIN Reason=slurm_robust: pending deep check: y [slurm@1]",
     ("draining", "slurm_robust: pending deep check: y")),
    ("NodeName=node3 State=IDLE ThreadsPerCore=1", ("idle", "")),
])
def test_node_state_reason_reads_scontrol(line: str, expected: tuple[str, str]) -> None:
    from slurm_robust.slurm import Slurm

    class OneLine(Slurm):
        def _run(self, argv, policy=None, input_text=None):  # type: ignore[no-untyped-def]
            assert argv[:3] == ["scontrol", "show", "node"]
            return line + "\n"

    assert OneLine().node_state_reason("node3") == expected


def test_deep_check_outcomes_go_to_the_node_ledger(tmp_path: Path) -> None:
    """A pass is a deep_check_passed and a return to service, a failure a
    deep_check_failed and a drain: two failures make the node a lemon by default."""
    from slurm_robust.health.lemons import lemons
    from slurm_robust.health.node_ledger import EventKind, LedgerConfig, NodeLedger

    site = SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True,
                      checks=LIGHT, ledger={"dir": str(tmp_path / "ledger"),
                                            "lemons_file": str(tmp_path / "lemons.json")})
    deep_check_and_return("node3", "node3", FakeSlurm([PENDING]), site)  # type: ignore[arg-type]
    path = inject_path(site.state_path("node3"))
    path.write_text('{"shm_free_bytes": 0}')
    for _ in range(2):
        deep_check_and_return("node3", "node3", FakeSlurm([PENDING]),  # type: ignore[arg-type]
                              site)
    deep_check_and_return("node3", "node3", FakeSlurm([("idle", "")]),  # type: ignore[arg-type]
                          site)  # not pending: left, nothing recorded
    led = NodeLedger(LedgerConfig(dir=str(tmp_path / "ledger")))
    assert [(e.kind, e.source) for e in led.history("node3")] == [
        (EventKind.DEEP_CHECK_PASSED, "health_check"), (EventKind.RETURNED, "health_check"),
        (EventKind.DEEP_CHECK_FAILED, "health_check"), (EventKind.DRAIN, "health_check"),
        (EventKind.DEEP_CHECK_FAILED, "health_check"), (EventKind.DRAIN, "health_check")]
    assert lemons(led) == ["node3"]
