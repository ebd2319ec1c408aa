"""A check says beside itself what the in-job monitor does with it (``in_job``): the
monitor's schedule, fatal list and incident classes are read from those declarations,
so a check added in one file runs in-job without an edit to the monitor."""

from __future__ import annotations

import pytest

from slurm_robust.health import framework
from slurm_robust.health.framework import InJob, check, ok, registered_checks
from slurm_robust.launcher.node import monitor
from slurm_robust.taxonomy import FailureClass


def test_the_monitor_runs_what_the_checks_declare() -> None:
    declared = {n: c.in_job for n, c in registered_checks().items() if c.in_job}
    for kind in framework.IN_JOB_KINDS:
        assert monitor.DEFAULTS[kind]["checks"] == [
            n for n, how in declared.items() if how.kind == kind and how.default]
    assert monitor.DEFAULT_FATAL == [n for n, how in declared.items() if how.fatal]
    assert monitor.CHECK_CLASS == {n: how.cls for n, how in declared.items() if how.cls}


def test_the_declared_schedule_is_byterobusts() -> None:
    # Pinned: moving the declarations beside the checks changed nothing the monitor does.
    assert monitor.DEFAULTS["gpu"]["checks"] == ["gpu_count", "gpu_xid", "gpu_ecc",
                                                 "gpu_remap", "gpu_thermal"]
    assert monitor.DEFAULTS["network"]["checks"] == ["net_ib_ports", "net_eth_links"]
    assert monitor.DEFAULTS["host"]["checks"] == ["host_disk_free", "host_mem_available"]
    assert monitor.DEFAULT_FATAL == ["gpu_count", "gpu_ecc", "gpu_remap"]
    assert monitor.CHECK_CLASS["gpu_nvlink"] == FailureClass.GPU_UNAVAILABLE
    assert "gpu_xid" not in monitor.CHECK_CLASS  # judged from the Xid catalogue


def test_a_new_check_declared_in_one_place_is_scheduled() -> None:
    @check("host_test_only_probe", ("quick",), 1.0,
           in_job=InJob("host", FailureClass.DISK_FULL, fatal=True))
    def probe(ctx: framework.CheckContext, params: object) -> framework.Outcome:
        return ok()

    try:
        declared = {n: c.in_job for n, c in registered_checks().items() if c.in_job}
        assert "host_test_only_probe" in monitor._default_checks("host", declared)
        assert declared["host_test_only_probe"].fatal
    finally:
        framework._REGISTRY.pop("host_test_only_probe")


def test_an_unknown_in_job_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="in-job kind"):
        check("bad_kind_check", ("quick",), 1.0,
              in_job=InJob("disk", FailureClass.DISK_FULL))(lambda ctx, p: ok())
