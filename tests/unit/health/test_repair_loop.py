"""The break-fix loop (health/repair.py) through the real deep check of a pending node
(node_deep_check.deep_check_and_return): the real suite, failed through the probe
injection file; Slurm is a stateful fake of the three node calls it makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health.drain import DEEP_FAILED_PREFIX, PENDING_PREFIX
from slurm_robust.health.node_ledger import EventKind
from slurm_robust.health.probes import inject_path
from slurm_robust.health.repair import (
    RebootPolicy,
    RepairPhase,
    boot_identity,
    load_record,
    repair_config,
)
from slurm_robust.node_deep_check import deep_check_and_return, ledger_events
from slurm_robust.site_config import SiteConfig
from tests.unit.health.test_node_deep_check import LIGHT


class NodeSlurm:
    """One node's state and reason, changed by drain and resume as Slurm would."""

    def __init__(self, reason: str) -> None:
        self.state, self.reason = "drained", reason
        self.calls: list[tuple[str, ...]] = []

    def node_state_reason(self, node: str) -> tuple[str, str]:
        return self.state, self.reason

    def drain(self, node: str, reason: str) -> None:
        self.calls.append(("drain", reason))
        self.reason = reason

    def resume(self, node: str) -> None:
        self.calls.append(("resume",))
        self.state, self.reason = "idle", ""


class Reboots:
    def __init__(self, fail: str = "") -> None:
        self.argvs: list[list[str]] = []
        self.fail = fail

    def __call__(self, argv: list[str]) -> str:
        self.argvs.append(argv)
        return self.fail


def site(tmp_path: Path, **repair: object) -> SiteConfig:
    return SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True,
                      checks=LIGHT, repair=dict(repair))


def break_node(cfg: SiteConfig, broken: bool = True) -> None:
    path = inject_path(cfg.state_path("node3"))
    path.parent.mkdir(parents=True, exist_ok=True)
    if broken:
        path.write_text('{"shm_free_bytes": 0}')
    elif path.exists():
        path.unlink()


BLAMED = f"{PENDING_PREFIX} gpu_xid: Xid 79 from job 7"


def step(cfg: SiteConfig, slurm: NodeSlurm, boot: str, reboots: Reboots, now: float):
    return deep_check_and_return("node3", "node3", slurm, cfg, boot,  # type: ignore[arg-type]
                                 run=reboots, now=lambda: now)


def test_defaults_are_one_deep_check_then_a_human(tmp_path: Path) -> None:
    cfg = site(tmp_path)
    break_node(cfg)
    slurm, reboots = NodeSlurm(BLAMED), Reboots()
    out = step(cfg, slurm, "b1", reboots, 100.0)
    assert out.action == "drained" and reboots.argvs == []
    assert slurm.reason.startswith(f"{DEEP_FAILED_PREFIX} deep_shm_free:")
    assert "repair rounds" not in slurm.reason  # one round: today's words


def test_a_passing_node_is_rebooted_revalidated_and_resumed(tmp_path: Path) -> None:
    cfg = site(tmp_path, rounds=3, reboot="always",
               reboot_command=["reboot-it", "{node}", "--why={reason}"])
    slurm, reboots = NodeSlurm(BLAMED), Reboots()
    out = step(cfg, slurm, "boot-1", reboots, 100.0)
    assert out.passed and out.action == "rebooting"
    assert slurm.reason.startswith(f"{PENDING_PREFIX} repair 1/3 rebooting: gpu_xid")
    assert reboots.argvs == [["reboot-it", "node3", f"--why={slurm.reason}"]]
    rec = load_record(cfg.state_path("node3"), "node3")
    assert rec is not None and rec.phase is RepairPhase.REBOOTING and rec.boot == "boot-1"
    # HealthCheckProgram runs again before the reboot happened: nothing to do.
    assert step(cfg, slurm, "boot-1", reboots, 160.0).reason == "reboot under way"
    # Back with a new boot identity: re-validated and resumed, the loop's file removed.
    out = step(cfg, slurm, "boot-2", reboots, 400.0)
    assert out.action == "resumed" and slurm.state == "idle"
    assert load_record(cfg.state_path("node3"), "node3") is None
    assert len(reboots.argvs) == 1


def test_a_node_that_keeps_failing_goes_to_a_human_after_n_rounds(tmp_path: Path) -> None:
    cfg = site(tmp_path, rounds=2, reboot="on_failure", reboot_command=["r", "{node}"])
    break_node(cfg)
    slurm, reboots = NodeSlurm(BLAMED), Reboots()
    actions = []
    for i, boot in enumerate(["a", "b", "b", "c"]):
        actions.append(step(cfg, slurm, boot, reboots, 100.0 * (i + 1)).action)
        if actions[-1] == "next_round":
            assert slurm.reason.startswith(f"{PENDING_PREFIX} repair 2/2: deep_shm_free")
    # Round 1: fails -> reboot -> fails again (next round); round 2: the same -> human.
    assert actions == ["rebooting", "next_round", "rebooting", "drained"]
    assert slurm.reason.startswith(f"{DEEP_FAILED_PREFIX} deep_shm_free")
    assert slurm.reason.endswith("(2 repair rounds)") and len(reboots.argvs) == 2
    rec = load_record(cfg.state_path("node3"), "node3")
    assert rec is not None and rec.phase is RepairPhase.HUMAN and rec.round == 2
    assert [(h["round"], h["step"], h["passed"]) for h in rec.history] == [
        (1, "deep_check", False), (1, "reboot", None), (1, "revalidate", False),
        (2, "deep_check", False), (2, "reboot", None), (2, "revalidate", False)]
    # Nothing resumes it now: the next HealthCheckProgram run leaves it.
    assert step(cfg, slurm, "d", reboots, 900.0).action == "left"
    # A human's `node resume` puts it back pending: a fresh loop from round 1.
    break_node(cfg, broken=False)
    slurm.reason = f"{PENDING_PREFIX} resume requested by admin"
    assert step(cfg, slurm, "d", reboots, 1000.0).action == "resumed"


def test_a_reboot_that_fails_or_never_comes_ends_the_round(tmp_path: Path) -> None:
    cfg = site(tmp_path, rounds=2, reboot="always", reboot_command=["r", "{node}"],
               reboot_timeout_s=600)
    slurm = NodeSlurm(BLAMED)
    out = step(cfg, slurm, "a", Reboots(fail="reboot command exited 1: denied"), 0.0)
    assert out.action == "next_round"
    assert slurm.reason.startswith(f"{PENDING_PREFIX} repair 2/2: reboot command exited 1")
    assert step(cfg, slurm, "a", Reboots(), 10.0).action == "rebooting"
    assert step(cfg, slurm, "a", Reboots(), 500.0).action == "left"  # still waiting
    out = step(cfg, slurm, "a", Reboots(), 700.0)  # 690 s > 600 s: never seen
    assert out.action == "drained" and "reboot not seen within 600 s" in slurm.reason


def test_ledger_rows_carry_the_round(tmp_path: Path) -> None:
    cfg = site(tmp_path, rounds=3, reboot="always", reboot_command=["r", "{node}"])
    slurm = NodeSlurm(BLAMED)
    out = step(cfg, slurm, "a", Reboots(), 0.0)
    rec = load_record(cfg.state_path("node3"), "node3")
    rows = ledger_events(out, rec)
    assert [r.kind for r in rows] == [EventKind.DEEP_CHECK_PASSED, EventKind.REPAIR]
    assert rows[1].evidence["repair"] == {"round": 1, "step": "rebooting"}


def test_repair_config_is_validated() -> None:
    assert repair_config({}).rounds == 1 and repair_config({}).reboot is RebootPolicy.NEVER
    assert repair_config({"reboot": "on_failure", "rounds": 3}).rounds == 3
    for bad, words in (({"rounds": 0}, "rounds"), ({"rounds": True}, "rounds"),
                       ({"reboot": "sometimes"}, "never, on_failure, always"),
                       ({"reboot_command": ["scontrol", "reboot"]}, "{node}"),
                       ({"reboot_command": "scontrol reboot {node}"}, "list"),
                       ({"reboot_timeout_s": 0}, "seconds"), ({"round": 2}, "unknown")):
        with pytest.raises(UsageError, match="repair"):
            repair_config(bad)
        with pytest.raises(UsageError, match=words.replace("{", r"\{").replace("}", r"\}")):
            repair_config(bad)


def test_boot_identity_names_the_nearest_slurmd(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("kernel-1\n")

    def stat(pid: int, comm: str, ppid: int, start: int) -> None:
        (proc / str(pid)).mkdir()
        rest = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5
        (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")

    stat(40, "sh", 30, 900)
    stat(30, "slurmd", 1, 555)
    assert boot_identity(40, proc) == "kernel-1:slurmd:30:555"
    assert boot_identity(30, proc) == "kernel-1:slurmd:30:555"
    stat(50, "python3", 1, 7)
    assert boot_identity(50, proc) == "kernel-1:no-slurmd"


def test_a_requested_check_is_one_check_without_a_reboot(tmp_path: Path) -> None:
    cfg = site(tmp_path, rounds=3, reboot="always", reboot_command=["r", "{node}"])
    reboots = Reboots()
    for why in ("resume requested by root", "reserve: deep pass stale"):
        slurm = NodeSlurm(f"{PENDING_PREFIX} {why}")
        assert step(cfg, slurm, "a", reboots, 0.0).action == "resumed"
    break_node(cfg)
    slurm = NodeSlurm(f"{PENDING_PREFIX} resume requested by root")
    assert step(cfg, slurm, "a", reboots, 0.0).action == "drained"
    assert "repair rounds" not in slurm.reason and reboots.argvs == []
