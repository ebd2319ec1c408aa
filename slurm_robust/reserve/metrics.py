"""The node-side exporter: health journals, drains, verdicts and the warm reserve.

A ``prometheus_client`` custom collector that, at scrape time, reads

- the reserve's state through :func:`slurm_robust.reserve.reconcile.status` (members,
  spares, target, each member's deep-pass age and freshness),
- every node's health journal (checks run and failed, by check name),
- the ``verdict_log`` (verdicts by action; drains by reason class and node),
- the reserve's action log (drains the reserve applied itself).

It serves ``slurm-robust exporter`` (one process per cluster, next to slurmctld). Scrapes
are served from a cache refreshed at most every ``min_interval_s``: every refresh costs
Slurm calls and a read of the logs, and several Prometheus servers may scrape.

Counters are counts of records in append-only logs, so they only grow while the logs do;
a rotated log restarts them, which Prometheus's ``rate``/``increase`` treat as a reset.
Labels: check names and reason classes come from closed sets (cleaned by
``label_value``); node names are bounded by the cluster's size.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from slurm_robust.errors import SlurmRobustError
from slurm_robust.health import read_journal
from slurm_robust.health.breaker import BreakerUnavailable, site_breaker
from slurm_robust.health.node_verdict import read_document
from slurm_robust.health.repair import loop_state
from slurm_robust.metric_labels import label_value
from slurm_robust.records import read_records
from slurm_robust.reserve.config import reserve_config
from slurm_robust.reserve.gate import LocalSuiteGate
from slurm_robust.reserve.reconcile import status as reserve_status
from slurm_robust.site_config import load_site_config
from slurm_robust.slurm import RetryPolicy, Slurm

log = logging.getLogger("slurm_robust.reserve.metrics")

VERDICT_ACTIONS = ("drained", "kept", "refused", "error")


@dataclass
class ExporterView:
    """One refresh's numbers (what a scrape reports)."""

    partition: str = ""
    target: int | None = None
    spares: int | None = None
    members: list[dict[str, Any]] = field(default_factory=list)
    checks: Tally[tuple[str, str]] = field(default_factory=Tally)   # (check, status)
    drains: Tally[tuple[str, str]] = field(default_factory=Tally)   # (node, reason class)
    verdicts: Tally[str] = field(default_factory=Tally)             # action
    recent_drains: Tally[str] = field(default_factory=Tally)        # node, in the window
    window_s: float = 72 * 3600.0
    reserve_error: bool = False
    taken_at: float = 0.0
    #: The drain circuit breaker's status (health/breaker.py); None: off. ``error``: on
    #: but not readable here.
    breaker: dict[str, Any] | None = None
    breaker_error: bool = False
    #: Each node's newest verdict document's severity (health/node_verdict.py).
    severities: dict[str, str] = field(default_factory=dict)
    #: Nodes in the break-fix loop: node -> (phase, round), from their drain reasons
    #: (health/repair.py loop_state).
    repair: dict[str, tuple[str, int]] = field(default_factory=dict)


def reason_class(record: dict[str, Any]) -> str:
    """The bounded class of a drain: repeat offender, the verdict's incident class, or the
    reserve's own reason (``reserve``)."""
    if "repeat offender" in str(record.get("reason", "")):
        return "repeat_offender"
    if record.get("op") in ("reconcile", "handoff"):
        return "reserve"
    return label_value(record.get("class"))


def tally_checks(records: Iterable[dict[str, Any]], into: Tally[tuple[str, str]]) -> None:
    for rec in records:
        into[(label_value(rec.get("check")), label_value(rec.get("status")))] += 1


def _drain(rec: dict[str, Any], view: ExporterView, now: float) -> None:
    node = str(rec["node"])
    view.drains[(node, reason_class(rec))] += 1
    if now - float(rec.get("time") or 0.0) <= view.window_s:
        view.recent_drains[node] += 1


def tally_verdict_log(records: Iterable[dict[str, Any]], view: ExporterView,
                      now: float) -> None:
    for rec in records:
        action = rec.get("action")
        view.verdicts[action if action in VERDICT_ACTIONS else "other"] += 1
        if action == "drained" and rec.get("ok") is not False and rec.get("node"):
            _drain(rec, view, now)


def tally_reserve_log(records: Iterable[dict[str, Any]], view: ExporterView,
                      now: float) -> None:
    for rec in records:
        if rec.get("action") == "drain" and rec.get("ok") and not rec.get("dry_run") \
                and not rec.get("skipped") and rec.get("node"):
            _drain(rec, view, now)


class ReserveCollector(Collector):
    """See the module docstring. ``refresh`` builds an :class:`ExporterView`."""

    def __init__(self, refresh: Callable[[], ExporterView], min_interval_s: float = 15.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._refresh = refresh
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._view: ExporterView | None = None
        self._lock = threading.Lock()

    def view(self) -> ExporterView:
        with self._lock:
            now = self.clock()
            if self._view is None or now - self._view.taken_at >= self.min_interval_s:
                self._view = self._refresh()
                self._view.taken_at = now
            return self._view

    def describe(self) -> list:
        return []  # families depend on the data; nothing to check at registration

    def collect(self) -> Iterator[Any]:
        v = self.view()
        part = [v.partition]
        g = GaugeMetricFamily("slurm_robust_reserve_up", "1 when the reserve state was read "
                              "from Slurm at the last refresh", labels=["partition"])
        g.add_metric(part, 0.0 if v.reserve_error else 1.0)
        yield g
        if not v.reserve_error:
            for name, text, val in (
                    ("slurm_robust_reserve_members", "Nodes in the reserve partition",
                     len(v.members)),
                    ("slurm_robust_reserve_spares", "Reserve members that are idle, not "
                     "drained and freshly deep-checked", v.spares),
                    ("slurm_robust_reserve_target", "Reserve size the planner aims for",
                     v.target)):
                g = GaugeMetricFamily(name, text, labels=["partition"])
                g.add_metric(part, float(val or 0))
                yield g
            age = GaugeMetricFamily("slurm_robust_reserve_member_deep_pass_age_seconds",
                                    "Seconds since the member's last passed deep suite "
                                    "(NaN: never)", labels=["partition", "node"])
            fresh = GaugeMetricFamily("slurm_robust_reserve_member_fresh", "1 when the "
                                      "member's deep pass is within freshness_h",
                                      labels=["partition", "node"])
            for m in v.members:
                hours = m.get("deep_pass_age_h")
                age.add_metric([v.partition, m["node"]],
                               float("nan") if hours is None else float(hours) * 3600.0)
                fresh.add_metric([v.partition, m["node"]], 1.0 if m.get("fresh") else 0.0)
            yield age
            yield fresh
        c = CounterMetricFamily("slurm_robust_health_checks", "Health-check results in the "
                                "node journals, by check and status", labels=["check", "status"])
        for (check, status), n in sorted(v.checks.items()):
            c.add_metric([check, status], n)
        yield c
        c = CounterMetricFamily("slurm_robust_node_drains", "Drains applied by slurm_robust, "
                                "by node and reason class", labels=["node", "reason_class"])
        for (node, cls), n in sorted(v.drains.items()):
            c.add_metric([node, cls], n)
        yield c
        g = GaugeMetricFamily("slurm_robust_node_recent_drains", "Drains of the node within "
                              "the repeat window (reserve.repeat_window_h, 72 h by default)",
                              labels=["node"])
        for node, n in sorted(v.recent_drains.items()):
            g.add_metric([node], n)
        yield g
        g = GaugeMetricFamily("slurm_robust_node_severity", "1, labelled with the "
                              "severity of the node's newest verdict document (PASS, INFO, "
                              "WARNING, CRITICAL, UNKNOWN)", labels=["node", "severity"])
        for node, sev in sorted(v.severities.items()):
            g.add_metric([node, sev], 1.0)
        yield g
        g = GaugeMetricFamily("slurm_robust_node_repair_round", "The round of the break-fix "
                              "loop a drained node is in, labelled with its phase (check, "
                              "rebooting, human: handed to a person after the last round)",
                              labels=["node", "phase"])
        for node, (phase, rnd) in sorted(v.repair.items()):
            g.add_metric([node, phase], float(rnd))
        yield g
        c = CounterMetricFamily("slurm_robust_verdicts", "Job verdicts handled by "
                                "EpilogSlurmctld, by action", labels=["action"])
        for action, n in sorted(v.verdicts.items()):
            c.add_metric([action], n)
        yield c
        yield from _breaker_metrics(v)


def _breaker_metrics(v: ExporterView) -> Iterator[Any]:
    """The drain circuit breaker, when it is on (health/breaker.py)."""
    if v.breaker is None and not v.breaker_error:
        return
    g = GaugeMetricFamily("slurm_robust_drain_breaker_up", "1 when the drain circuit "
                          "breaker's state was read at the last refresh")
    g.add_metric([], 0.0 if v.breaker_error else 1.0)
    yield g
    if v.breaker is None:
        return
    b = v.breaker
    for name, text, val in (
            ("slurm_robust_drain_breaker_tripped", "1 when the breaker holds automatic "
             "drains back (max_drains reached in the window)", 1.0 if b["tripped"] else 0.0),
            ("slurm_robust_drain_breaker_drains_in_window", "Nodes drained automatically "
             "within the breaker's window", b["in_window"]),
            ("slurm_robust_drain_breaker_max_drains", "The breaker's limit per window",
             b["max_drains"])):
        g = GaugeMetricFamily(name, text)
        g.add_metric([], float(val))
        yield g
    c = CounterMetricFamily("slurm_robust_drain_breaker_would_drain", "Automatic drains "
                            "the breaker held back (its would-drain records)")
    c.add_metric([], float(b["would_drain_total"]))
    yield c


def cluster_refresh(site_path: str | None = None) -> Callable[[], ExporterView]:
    """The refresh that reads the real cluster: Slurm, the journals and the logs."""
    site = load_site_config(site_path) if site_path else load_site_config()
    cfg = reserve_config(site)

    def refresh() -> ExporterView:
        slurm = Slurm(policy=RetryPolicy(attempts=1, timeout_s=cfg.call_timeout_s))
        view = ExporterView(partition=cfg.partition, window_s=cfg.repeat_window_h * 3600.0)
        now = time.time()
        try:
            st = reserve_status(slurm, LocalSuiteGate(site, slurm.node_address), cfg)
            view.target, view.spares, view.members = st["target"], st["spares"], st["members"]
            listed = slurm.nodes()
            nodes = {n.name for n in listed}
            for n in listed:
                loop = loop_state(n.reason or "")
                if loop is not None:
                    view.repair[n.name] = (loop["phase"], int(loop["round"]))
        except Exception as exc:  # noqa: BLE001 - one failed refresh must not kill the server
            log.warning("reserve state not read: %s", exc)
            view.reserve_error = True
            nodes = set()
        for node in sorted(nodes):
            tally_checks(read_journal(node, config=site), view.checks)
            doc = read_document(node, config=site)
            if doc is not None:
                view.severities[node] = str(doc["severity"])
        tally_verdict_log(read_records(Path(site.verdict_log)).records, view, now)
        tally_reserve_log(read_records(cfg.log_file).records, view, now)
        try:
            breaker = site_breaker(site.breaker)
            view.breaker = breaker.status(now) if breaker is not None else None
        except (BreakerUnavailable, SlurmRobustError) as exc:
            log.warning("drain circuit breaker not read: %s", exc)
            view.breaker_error = True
        return view

    return refresh
