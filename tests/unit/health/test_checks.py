"""Each check's decision on injected readings, through the real probe layer and suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_robust.errors import UsageError
from slurm_robust.health import Probes, Status, run_suite
from slurm_robust.site_config import SiteConfig

GIB = 1 << 30


@pytest.fixture()
def cfg(tmp_path: Path) -> SiteConfig:
    return SiteConfig(state_dir=str(tmp_path / "{node}" / "state"), injection_enabled=True)


def quick(cfg: SiteConfig, **injected: object) -> dict[str, object]:
    result = run_suite("prolog", "n1", job="7", config=cfg, probes=Probes(injected),
                       journal=False)
    return {r.check: r for r in result.results}


def test_no_nvml_skips_gpu_checks(cfg: SiteConfig) -> None:
    res = quick(cfg)
    for name in ("gpu_count", "gpu_xid", "gpu_ecc", "gpu_thermal", "nvml_responsive"):
        assert res[name].status is Status.SKIP
        assert res[name].reason == f"{name}: skipped: no NVML"


def test_no_nvml_fails_when_site_expects_gpus(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), gpus_per_node=8)
    res = quick(cfg)
    assert res["gpu_count"].status is Status.FAIL
    assert "expected 8 GPUs" in res["gpu_count"].reason


def test_critical_xid_fails_with_gpu_named(cfg: SiteConfig) -> None:
    res = quick(cfg, xid_events=[{"gpu": 3, "xid": 79}])
    r = res["gpu_xid"]
    assert r.status is Status.FAIL
    assert r.reason == "gpu_xid: Xid 79 on GPU 3, expected no critical Xid"
    assert r.evidence == {"events": [{"gpu": 3, "xid": 79}]}
    assert r.injected
    assert res["gpu_ecc"].status is Status.SKIP  # other GPU probes are not injected


def test_non_critical_xid_warns(cfg: SiteConfig) -> None:
    assert quick(cfg, xid_events=[{"gpu": 0, "xid": 8}])["gpu_xid"].status is Status.WARN


@pytest.mark.parametrize(("probe", "value", "check", "words"), [
    ("gpu_count", 7, "gpu_count", "actual 7 GPUs, expected 8"),
    ("ecc_uncorrectable", [0, 2], "gpu_ecc", "actual 2 uncorrectable ECC errors on GPU 1"),
    ("remap", [None, {"pending": True, "failure": False, "uncorrectable": 1}], "gpu_remap",
     "row remapping pending on GPU 1"),
    ("retired_pages", [{"pending": False, "count": 61}], "gpu_remap", "actual 61 retired pages"),
    ("temperature_c", [40, 91], "gpu_thermal", "actual 91 C on GPU 1, expected <= 85 C"),
    ("throttle_reasons", [0x40], "gpu_thermal", "hardware throttling (mask 0x40)"),
    ("pcie", [{"gen": 5, "max_gen": 5, "width": 8, "max_width": 16}], "gpu_pcie",
     "actual PCIe x8 on GPU 0, expected x16"),
    ("nvlink", [{"up": 18, "down": 0}, {"up": 16, "down": 2}], "gpu_nvlink",
     "actual 2 NVLink link(s) down on GPU 1"),
    ("compute_procs", [{"gpu": 2, "pid": 4242}], "gpu_procs", "(pid 4242)"),
])
def test_gpu_faults_fail(tmp_path: Path, probe: str, value: object, check: str,
                         words: str) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), gpus_per_node=8)
    r = quick(cfg, **{probe: value})[check]
    assert r.status is Status.FAIL, r
    assert words in r.reason


def test_healthy_gpu_readings_pass(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), gpus_per_node=2)
    res = quick(cfg, gpu_count=2, xid_events=[], ecc_uncorrectable=[0, 0],
                remap=[{"pending": False, "failure": False, "uncorrectable": 0}] * 2,
                retired_pages=[None, None], temperature_c=[35, 36], throttle_reasons=[0, 0],
                pcie=[{"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}] * 2,
                nvlink=[{"up": 18, "down": 0}] * 2, compute_procs=[])
    assert {n: r.status for n, r in res.items() if n.startswith("gpu_")} == {
        n: Status.OK for n in res if n.startswith("gpu_")}


def test_idle_pcie_gen_only_warns(cfg: SiteConfig) -> None:
    r = quick(cfg, pcie=[{"gen": 1, "max_gen": 5, "width": 16, "max_width": 16}])["gpu_pcie"]
    assert r.status is Status.WARN


def test_gpu_procs_only_on_the_jobs_gpus(cfg: SiteConfig) -> None:
    result = run_suite("prolog", "n1", config=cfg, journal=False, job_gpus=frozenset({0, 1}),
                       probes=Probes({"compute_procs": [{"gpu": 5, "pid": 9}]}))
    assert {r.check: r.status for r in result.results}["gpu_procs"] is Status.OK


def test_hung_nvml_is_bounded_by_the_budget(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"),
                     checks={"nvml_responsive": {"budget_s": 0.3}})
    result = run_suite("prolog", "n1", config=cfg, journal=False,
                       probes=Probes({"nvml_delay_s": 5}))
    res = {r.check: r for r in result.results}
    assert res["nvml_responsive"].status is Status.FAIL
    assert "budget" in res["nvml_responsive"].reason
    # Later GPU checks fail at once instead of waiting on the hung driver again.
    assert res["gpu_ecc"].status is Status.FAIL
    assert "hung" in res["gpu_ecc"].reason
    assert res["gpu_ecc"].duration_s < 0.2


def test_host_disk_and_memory(cfg: SiteConfig) -> None:
    res = quick(cfg, disk_free_bytes={"/tmp": GIB // 2}, mem_available_bytes=GIB // 4)
    assert res["host_disk_free"].status is Status.FAIL
    assert "actual 0.50 GiB free on /tmp, expected >= 1 GiB" in res["host_disk_free"].reason
    assert res["host_mem_available"].status is Status.FAIL


def test_stray_processes_warn_by_default_and_fail_when_configured(tmp_path: Path) -> None:
    procs = [{"pid": 10, "uid": 0, "comm": "sshd"}, {"pid": 11, "uid": 1500, "comm": "python"},
             {"pid": 12, "uid": 1600, "comm": "train"}]
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"))
    res = run_suite("prolog", "n1", config=cfg, journal=False, job_uid=1600,
                    probes=Probes({"processes": procs})).results
    stray = {r.check: r for r in res}["host_stray_procs"]
    assert stray.status is Status.WARN
    assert stray.evidence["uids"] == [1500]
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), checks={"host_stray_procs":
                                                               {"fail": True}})
    res = run_suite("prolog", "n1", config=cfg, journal=False, job_uid=1600,
                    probes=Probes({"processes": procs})).results
    assert {r.check: r for r in res}["host_stray_procs"].status is Status.FAIL


def test_stale_lock_found_on_disk(cfg: SiteConfig, tmp_path: Path) -> None:
    locks = tmp_path / "n1" / "state" / "locks"
    locks.mkdir(parents=True)
    (locks / "alive.lock").write_text(str(__import__("os").getpid()))
    assert quick(cfg)["host_stale_lock"].status is Status.OK
    (locks / "dead.lock").write_text("999999999")
    r = quick(cfg)["host_stale_lock"]
    assert r.status is Status.FAIL
    assert "dead.lock (pid 999999999 gone" in r.reason


def test_deep_suite_passes_here_and_fails_on_injected_shm(tmp_path: Path) -> None:
    # Throughput floors off: this machine's 2 shared cores make speed a poor unit-test
    # subject (the floors themselves are tested below with impossible values).
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), checks={
        "deep_matmul": {"min_gflops": 0.0}, "deep_membw": {"min_gbps": 0.0},
        "deep_disk_io": {"min_write_mbps": 0.0}})
    result = run_suite("epilog", "n1", config=cfg, journal=False, probes=Probes())
    assert result.passed, result.reason
    names = [r.check for r in result.results]
    assert {"deep_matmul", "deep_membw", "deep_collective", "deep_disk_io", "deep_shm_free",
            "deep_mounts"} <= set(names)
    assert "host_stray_procs" not in names  # quick suite only
    result = run_suite("epilog", "n1", config=cfg, journal=False,
                       probes=Probes({"shm_free_bytes": 0}))
    assert not result.passed
    assert result.reason.startswith("slurm_robust: deep_shm_free: actual 0.00 GiB free")


def test_deep_thresholds_and_mounts_can_fail(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), checks={
        "deep_membw": {"min_gbps": 1e9}, "deep_mounts": {"required": ["/no/such/mount"]},
        "deep_collective": {"enabled": False}, "deep_matmul": {"max_rel_err": 0.0}})
    res = {r.check: r for r in run_suite("epilog", "n1", config=cfg, journal=False).results}
    assert res["deep_membw"].status is Status.FAIL
    assert res["deep_mounts"].reason == ("deep_mounts: actual /no/such/mount not mounted, "
                                         "expected mounted")
    assert res["deep_matmul"].status is Status.FAIL  # float32 is never exact
    assert "deep_collective" not in res


def test_skip_stages_leaves_a_check_out_of_those_stages_only(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), checks={
        "deep_collective": {"skip_stages": ["epilog"]}, "deep_matmul": {"min_gflops": 0.0},
        "deep_membw": {"min_gbps": 0.0}, "deep_disk_io": {"min_write_mbps": 0.0}})
    epilog = [r.check for r in run_suite("epilog", "n1", config=cfg, journal=False).results]
    assert "deep_collective" not in epilog and "deep_matmul" in epilog
    resume = {r.check: r for r in run_suite("resume", "n1", config=cfg, journal=False).results}
    assert resume["deep_collective"].status is Status.OK, resume["deep_collective"]


def test_skip_stages_names_only_known_stages(tmp_path: Path) -> None:
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"),
                     checks={"deep_collective": {"skip_stages": ["epliog"]}})
    with pytest.raises(UsageError, match=r"skip_stages: unknown stage\(s\) \['epliog'\]; "
                                         "valid: prolog, epilog"):
        run_suite("epilog", "n1", config=cfg, journal=False)
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"),
                     checks={"deep_collective": {"skip_stages": "epilog"}})
    with pytest.raises(UsageError, match="must be list"):
        run_suite("epilog", "n1", config=cfg, journal=False)


def test_unknown_check_or_parameter_is_a_usage_error(tmp_path: Path) -> None:
    for checks, words in (({"gpu_xyd": {}}, "unknown check(s) ['gpu_xyd']"),
                          ({"gpu_xid": {"critcal": [79]}}, "valid parameters with defaults"),
                          ({"gpu_thermal": {"max_temp_c": "hot"}}, "must be int")):
        cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), checks=checks)
        with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("]", r"\]")):
            run_suite("prolog", "n1", config=cfg, journal=False)


def test_site_module_adds_its_own_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mysite_checks.py").write_text(
        "from slurm_robust.health import check, fail, ok\n"
        "@check('site_scratch_marker', ('quick',), 1.0, {'want': 1})\n"
        "def site_scratch_marker(ctx, params):\n"
        "    n = ctx.probes.get('mem_available_bytes')\n"
        "    return ok(n=n) if n >= params['want'] else fail(f'actual {n}, expected more')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = SiteConfig(state_dir=str(tmp_path / "{node}"), checks={
        "site_modules": ["mysite_checks"], "site_scratch_marker": {"want": 10}})
    res = run_suite("prolog", "n1", config=cfg, journal=False,
                    probes=Probes({"mem_available_bytes": 5}))
    assert res.reason.startswith("slurm_robust: host_mem_available:")
    assert {r.check: r.reason for r in res.failures}["site_scratch_marker"] == (
        "site_scratch_marker: actual 5, expected more")
