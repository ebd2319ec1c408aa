"""A check that cannot run: never a drain in service; per check, no admission when the site
says it is fail-closed (``checks.<name>.on_error``).

The failure is a real one: the real ``deep_shm_free`` check raises on a /dev/shm size it
cannot parse, fed through the probe injection file every probe reading goes through."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health import last_deep_pass, run_suite
from slurm_robust.health.drain import DEEP_FAILED_PREFIX
from slurm_robust.health.framework import Status, registered_checks
from slurm_robust.health.journal import journal_path
from slurm_robust.health.probes import Probes, inject_path
from slurm_robust.health.suite import plan_suite
from slurm_robust.node_deep_check import deep_check_and_return
from slurm_robust.reserve.gate import LocalSuiteGate
from slurm_robust.site_config import SiteConfig
from tests.unit.health.test_node_deep_check import LIGHT, PENDING, FakeSlurm

UNPARSEABLE = {"shm_free_bytes": "lots"}


def site_with(tmp_path: Path, policy: str | None) -> SiteConfig:
    checks = {k: dict(v) for k, v in LIGHT.items()}
    if policy is not None:
        checks["deep_shm_free"] = {"on_error": policy}
    return SiteConfig(state_dir=str(tmp_path / "{node}"), injection_enabled=True,
                      checks=checks)


def inject(site: SiteConfig, node: str, values: dict) -> None:
    path = inject_path(site.state_path(node))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))


def test_an_unknown_policy_is_refused_naming_the_choices(tmp_path: Path) -> None:
    chk = registered_checks()["deep_shm_free"]
    assert chk.resolve_params({})["on_error"] == "open"
    with pytest.raises(UsageError, match=r"checks.deep_shm_free.on_error must be one of "
                                         r"open, closed, got 'sometimes'"):
        chk.resolve_params({"on_error": "sometimes"})


@pytest.mark.parametrize("policy", [None, "open", "closed"])
def test_in_service_an_error_never_fails_the_suite(tmp_path: Path, policy: str | None) -> None:
    site = site_with(tmp_path, policy)
    result = run_suite("epilog", "n1", job="9", config=site, probes=Probes(UNPARSEABLE))
    by = {r.check: r for r in result.results}
    assert by["deep_shm_free"].status is Status.ERROR
    assert result.passed and result.reason == ""  # what the epilog drains on: nothing
    assert result.admits is (policy != "closed")


def test_fail_closed_error_keeps_a_pending_node_out_naming_the_check(tmp_path: Path) -> None:
    site = site_with(tmp_path, "closed")
    inject(site, "node3", UNPARSEABLE)
    slurm = FakeSlurm([PENDING])
    out = deep_check_and_return("node3", "node3", slurm, site)  # type: ignore[arg-type]
    assert not out.passed and out.action == "drained"
    assert slurm.calls[0][0] == "drain"
    assert slurm.calls[0][2].startswith(
        f"{DEEP_FAILED_PREFIX} deep_shm_free: could not run, fail-closed: check program "
        "error ValueError"), slurm.calls
    # The run is journaled with its policy, and is no deep pass for the reserve.
    journal = [json.loads(line) for line in
               journal_path("node3", site).read_text().splitlines()]
    shm = [r for r in journal if r["check"] == "deep_shm_free"]
    assert shm[-1]["status"] == "error" and shm[-1]["on_error"] == "closed"
    assert last_deep_pass("node3", config=site) is None


def test_fail_open_error_returns_the_node_as_before(tmp_path: Path) -> None:
    site = site_with(tmp_path, None)
    inject(site, "node3", UNPARSEABLE)
    slurm = FakeSlurm([PENDING])
    out = deep_check_and_return("node3", "node3", slurm, site)  # type: ignore[arg-type]
    assert out.passed and out.action == "resumed" and slurm.calls == [("resume", "node3")]
    journal = journal_path("node3", site).read_text()
    assert '"on_error"' not in journal  # the default adds nothing to the record
    assert last_deep_pass("node3", config=site) is not None


def test_the_reserve_deep_pass_admits_only_when_fail_closed_checks_ran(tmp_path: Path) -> None:
    site = site_with(tmp_path, "closed")
    inject(site, "spare1", UNPARSEABLE)
    gate = LocalSuiteGate(site, lambda node: "127.0.0.1")
    run = gate.run_deep("spare1")
    assert run.ran and not run.passed and "deep_shm_free: could not run" in run.reason
    inject(site, "spare1", {})
    assert gate.run_deep("spare1").passed


def test_the_admin_guide_example_is_a_valid_fail_closed_setting(tmp_path: Path) -> None:
    guide = (Path(__file__).parents[3] / "docs" / "ADMIN_GUIDE.md").read_text()
    example, = [m for m in re.findall(r"`(\{[^`]*\})`", guide) if '"on_error"' in m]
    site = SiteConfig(state_dir=str(tmp_path / "{node}"), **json.loads(example))
    planned, _budget = plan_suite("deep", site)
    (check, params), = [(c, p) for c, p in planned if p["on_error"] == "closed"]
    assert check.name == "gpu_ecc"
