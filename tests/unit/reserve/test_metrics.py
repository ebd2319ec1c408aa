"""The reserve/health exporter's collector, parsed back with prometheus_client's parser."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_robust.reserve.metrics import (
    ExporterView,
    ReserveCollector,
    reason_class,
    tally_checks,
    tally_reserve_log,
    tally_verdict_log,
)
from slurm_robust_rehearsal.cluster import prometheus as prom
from slurm_robust_rehearsal.cluster.config import ClusterConfig

NOW = 1_000_000.0
H = 3600.0


def scrape(collector: ReserveCollector) -> dict[tuple[str, tuple], float]:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def view() -> ExporterView:
    v = ExporterView(partition="standby", target=2, spares=1, members=[
        {"node": "n5", "fresh": True, "deep_pass_age_h": 1.5},
        {"node": "n6", "fresh": False, "deep_pass_age_h": None}])
    tally_checks([{"check": "disk_free", "status": "ok"}, {"check": "disk_free",
                  "status": "fail"}, {"check": "gpu_xid", "status": "ok"},
                  {"check": "/etc/passwd", "status": "ok"}], v.checks)
    tally_verdict_log([
        {"action": "drained", "ok": True, "node": "n1", "class": "node_lost",
         "reason": "slurm_robust: lost", "time": NOW - 80 * H},
        {"action": "drained", "ok": True, "node": "n1", "class": "gpu_error",
         "reason": "slurm_robust: repeat offender: xid", "time": NOW - H},
        {"action": "refused", "node": None, "time": NOW},
        {"action": "kept", "ok": True, "node": "n2", "class": "hang", "time": NOW}], v, NOW)
    tally_reserve_log([
        {"op": "reconcile", "action": "drain", "ok": True, "node": "n2", "time": NOW - H},
        {"op": "reconcile", "action": "drain", "ok": True, "node": "n3", "dry_run": True,
         "time": NOW}], v, NOW)
    v.severities.update({"n1": "CRITICAL", "n5": "PASS"})
    v.repair.update({"n2": ("rebooting", 2), "n3": ("human", 3)})
    return v


def test_collector_reports_reserve_checks_drains_and_verdicts():
    got = scrape(ReserveCollector(view))
    part = ("partition", "standby")
    assert got[("slurm_robust_reserve_members", (part,))] == 2
    assert got[("slurm_robust_reserve_spares", (part,))] == 1
    assert got[("slurm_robust_reserve_target", (part,))] == 2
    assert got[("slurm_robust_reserve_up", (part,))] == 1
    assert got[("slurm_robust_reserve_member_deep_pass_age_seconds",
                (("node", "n5"), part))] == 1.5 * H
    assert got[("slurm_robust_reserve_member_fresh", (("node", "n6"), part))] == 0
    assert got[("slurm_robust_health_checks_total",
                (("check", "disk_free"), ("status", "fail")))] == 1
    assert got[("slurm_robust_health_checks_total",
                (("check", "other"), ("status", "ok")))] == 1   # no paths as labels
    assert got[("slurm_robust_node_drains_total",
                (("node", "n1"), ("reason_class", "node_lost")))] == 1
    assert got[("slurm_robust_node_drains_total",
                (("node", "n1"), ("reason_class", "repeat_offender")))] == 1
    assert got[("slurm_robust_node_drains_total",
                (("node", "n2"), ("reason_class", "reserve")))] == 1
    assert ("slurm_robust_node_drains_total", (("node", "n3"), ("reason_class", "reserve"))) \
        not in got                                          # a dry run drains nothing
    assert got[("slurm_robust_node_recent_drains", (("node", "n1"),))] == 1  # 80 h ago: out
    assert got[("slurm_robust_verdicts_total", (("action", "refused"),))] == 1
    assert got[("slurm_robust_node_severity", (("node", "n1"), ("severity", "CRITICAL")))] == 1
    assert got[("slurm_robust_node_severity", (("node", "n5"), ("severity", "PASS")))] == 1
    assert got[("slurm_robust_node_repair_round", (("node", "n2"), ("phase", "rebooting")))] == 2
    assert got[("slurm_robust_node_repair_round", (("node", "n3"), ("phase", "human")))] == 3


def test_a_failed_reserve_read_is_reported_not_raised():
    got = scrape(ReserveCollector(lambda: ExporterView(partition="standby",
                                                       reserve_error=True)))
    assert got[("slurm_robust_reserve_up", (("partition", "standby"),))] == 0
    assert not any(k[0] == "slurm_robust_reserve_members" for k in got)


def test_refreshes_are_cached_between_scrapes():
    calls = []
    t = [0.0]

    def refresh() -> ExporterView:
        calls.append(1)
        return ExporterView(partition="standby")

    c = ReserveCollector(refresh, min_interval_s=10.0, clock=lambda: t[0])
    c.view()
    c.view()
    t[0] = 11.0
    c.view()
    assert len(calls) == 2


def test_reason_class():
    assert reason_class({"reason": "slurm_robust: repeat offender: x"}) == "repeat_offender"
    assert reason_class({"op": "handoff"}) == "reserve"
    assert reason_class({"class": "Free Text!"}) == "other"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed "
                    "(Debian package prometheus)")
def test_generated_prometheus_config_and_alert_rules_pass_promtool(tmp_path):
    conf = tmp_path / "prometheus.yml"
    conf.write_text(prom.render_config(ClusterConfig(root=tmp_path)))
    out = subprocess.run(["promtool", "check", "config", str(conf)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(["promtool", "check", "rules", str(prom.ALERTS)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_dashboard_queries_parse_as_promql(tmp_path):
    import json

    dash = json.loads((prom.REPO_ROOT / "docs" / "grafana" / "slurm_robust.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 4
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"slurm_robust:dashboard_{i}",
         "expr": e.replace("$__rate_interval", "1m").replace("$job", ".*")}
        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(rules))       # JSON is YAML
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_drain_breaker_is_exported_when_on(tmp_path):
    from slurm_robust.health.breaker import BreakerConfig, DrainBreaker

    b = DrainBreaker(BreakerConfig(1, 3600.0, str(tmp_path / "breaker")))
    assert b.claim("n1", "slurm_robust: gpu_xid: x", "prolog", NOW).granted
    assert not b.claim("n2", "slurm_robust: gpu_xid: x", "prolog", NOW + 1).granted
    got = scrape(ReserveCollector(lambda: ExporterView(partition="standby",
                                                       breaker=b.status(NOW + 2))))
    assert got[("slurm_robust_drain_breaker_up", ())] == 1
    assert got[("slurm_robust_drain_breaker_tripped", ())] == 1
    assert got[("slurm_robust_drain_breaker_drains_in_window", ())] == 1
    assert got[("slurm_robust_drain_breaker_max_drains", ())] == 1
    assert got[("slurm_robust_drain_breaker_would_drain_total", ())] == 1
    off = scrape(ReserveCollector(lambda: ExporterView(partition="standby")))
    assert not any(k[0].startswith("slurm_robust_drain_breaker") for k in off)
    broken = scrape(ReserveCollector(lambda: ExporterView(partition="standby",
                                                          breaker_error=True)))
    assert broken[("slurm_robust_drain_breaker_up", ())] == 0
