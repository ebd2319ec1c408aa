"""The in-job monitor: each agent inspects its node while the job runs.

ByteRobust's agents look at their machine every few seconds during training and evict a
node on evidence before the job crashes on it. This thread does that with the checks of
:mod:`slurm_robust.health` (the same functions the prolog runs, through the same probe
layer, so ``slurm-robust inject probe`` reaches them), each kind on its own schedule:

======== ======== ===================================================================
kind     every    what
======== ======== ===================================================================
gpu      10 s     gpu_count, gpu_xid, gpu_ecc, gpu_remap, gpu_thermal (NVML)
kernel   2 s      the kernel log, followed: Xid, OOM killer, panic, I/O error lines
network  30 s     net_ib_ports, net_eth_links; 2 alerts within 300 s is fatal
host     30 s     host_disk_free, host_mem_available
sample   10 s     implicit readings for the controller: GPU use, SM clock, traffic
======== ======== ===================================================================

A non-ok result becomes a :class:`~slurm_robust.launcher.messages.Finding` (when its
status or reason changed since the last run of that check: a lasting condition is one
finding, not one per round; every network alert is one), journaled on the node (suite
``monitor``) and handed to the agent, which sends it in its next report. A fatal finding
(a hardware Xid, uncorrectable ECC, pending row remap, a lost GPU, a kernel panic, the
network's second alert in its window) makes the controller evict the node through the
ladder; a warning is recorded and counted only.

The thread never blocks the agent: each check runs bounded by its budget
(``framework.run_check``), and the agent only takes what is ready (:meth:`take`).
Settings: the site config's ``monitor`` section (:meth:`MonitorSettings.from_site`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from slurm_robust.errors import UsageError
from slurm_robust.health import checks as _builtin  # noqa: F401 - registers the checks
from slurm_robust.health.errors import NoNVMLError, NVMLHungError
from slurm_robust.health.framework import (
    CheckContext,
    CheckResult,
    InJob,
    Status,
    registered_checks,
    run_check,
)
from slurm_robust.health.journal import journal_path, make_records, write_run
from slurm_robust.health.kernlog import KernelEvent, KernelEventKind, scan
from slurm_robust.health.probes import Probes, enabled_injections
from slurm_robust.launcher.classify import XID_MEMORY, XID_UNAVAILABLE
from slurm_robust.launcher.enums import IncidentClass, Severity
from slurm_robust.launcher.messages import Finding, NodeSample
from slurm_robust.site_config import SiteConfig

log = logging.getLogger("slurm_robust.launcher.node.monitor")

SUITE = "monitor"
HARDWARE_XIDS = XID_MEMORY | XID_UNAVAILABLE

class KindDefaults(TypedDict):
    """One kind's keys in the site config's ``monitor`` section, with their defaults;
    ``alerts`` and ``window_s`` are the network's only."""

    interval_s: float
    checks: NotRequired[list[str]]
    alerts: NotRequired[int]
    window_s: NotRequired[float]


class _NetworkRule(TypedDict, total=False):
    """MonitorSettings' network alert rule, when the site config's section was read."""

    network_alerts: int
    network_window_s: float


class KernelFindingEvidence(TypedDict):
    """A kernel-log finding's evidence: the record's sequence number, its text, the
    event kind, and for an Xid its number and PCI bus."""

    seq: int
    line: str
    event: str
    xid: NotRequired[int]
    bus: NotRequired[str | None]


#: The checks that declare what the in-job monitor does with them (``in_job`` of
#: health.framework.check, written beside each check), in registration order.
IN_JOB: dict[str, InJob] = {name: c.in_job for name, c in registered_checks().items()
                            if c.in_job is not None}


def _default_checks(kind: str, declared: Mapping[str, InJob] = IN_JOB) -> list[str]:
    return [name for name, how in declared.items() if how.kind == kind and how.default]


#: Defaults (ByteRobust's schedule); the site config's ``monitor`` section overrides.
#: Which checks each kind runs comes from the checks' own declarations.
DEFAULTS: dict[str, KindDefaults] = {
    "gpu": {"interval_s": 10.0, "checks": _default_checks("gpu")},
    "kernel": {"interval_s": 2.0},
    "network": {"interval_s": 30.0, "checks": _default_checks("network"),
                "alerts": 2, "window_s": 300.0},
    "host": {"interval_s": 30.0, "checks": _default_checks("host")},
    "sample": {"interval_s": 10.0},
}
#: Checks whose failure is fatal (besides gpu_xid with a hardware Xid and the network's
#: repeated alerts), as each check declares.
DEFAULT_FATAL = [name for name, how in IN_JOB.items() if how.fatal]
#: The incident class a check's finding is handled as, as each check declares.
CHECK_CLASS: dict[str, str] = {name: how.cls for name, how in IN_JOB.items()
                               if how.cls is not None}
KERNEL_CLASS: dict[KernelEventKind, str] = {
    KernelEventKind.OOM: IncidentClass.CPU_OOM, KernelEventKind.PANIC: IncidentClass.KERNEL_PANIC,
    KernelEventKind.IO_ERROR: IncidentClass.DISK_FAULT,
    KernelEventKind.GPU_LOST: IncidentClass.GPU_UNAVAILABLE,
    # A task blocked in D state: often slow storage; a warning, diagnosed, never a panic.
    KernelEventKind.HUNG_TASK: IncidentClass.JOB_HANG,
}
#: Kernel events that are fatal at once (the node cannot go on), Xids aside.
FATAL_KERNEL = frozenset({KernelEventKind.PANIC, KernelEventKind.GPU_LOST})
KIND_CHECK = "kernel_log"


@dataclass(frozen=True)
class KindSettings:
    """One kind's schedule: how often, which checks (checks' own parameters stay in the
    site config's ``checks`` section, shared with the prolog)."""

    interval_s: float
    checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class MonitorSettings:
    enabled: bool = True
    gpu: KindSettings = KindSettings(10.0, tuple(DEFAULTS["gpu"]["checks"]))
    kernel: KindSettings = KindSettings(2.0)
    network: KindSettings = KindSettings(30.0, tuple(DEFAULTS["network"]["checks"]))
    host: KindSettings = KindSettings(30.0, tuple(DEFAULTS["host"]["checks"]))
    sample: KindSettings = KindSettings(10.0)
    network_alerts: int = 2
    network_window_s: float = 300.0
    fatal_checks: tuple[str, ...] = tuple(DEFAULT_FATAL)

    @classmethod
    def from_site(cls, raw: Mapping[str, Any] | None) -> MonitorSettings:
        """Validate the site config's ``monitor`` section; an unknown key, check or a bad
        value is a UsageError that lists what is valid."""
        raw = dict(raw or {})
        valid_top = {"enabled", "fatal_checks", *DEFAULTS}
        unknown = sorted(set(raw) - valid_top)
        if unknown:
            raise UsageError(f"site config monitor: unknown key(s) {unknown}; valid: "
                             f"{sorted(valid_top)} (defaults: {DEFAULTS}, fatal_checks="
                             f"{DEFAULT_FATAL})")
        enabled = raw.get("enabled", True)
        if not isinstance(enabled, bool):
            raise UsageError(f"site config monitor.enabled={enabled!r} must be true/false")
        known_checks = set(registered_checks())
        kinds: dict[str, KindSettings] = {}
        extra: _NetworkRule = {}
        for kind, defaults in DEFAULTS.items():
            section = raw.get(kind, {})
            if not isinstance(section, dict):
                raise UsageError(f"site config monitor.{kind} must be an object")
            bad = sorted(set(section) - set(defaults))
            if bad:
                raise UsageError(f"site config monitor.{kind}: unknown key(s) {bad}; valid "
                                 f"with defaults: {defaults}")
            merged = {**defaults, **section}
            interval = merged["interval_s"]
            if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                    or interval <= 0:
                raise UsageError(f"site config monitor.{kind}.interval_s={interval!r} "
                                 "must be a number > 0")
            names = merged.get("checks", [])
            if not isinstance(names, list) or set(names) - known_checks:
                raise UsageError(f"site config monitor.{kind}.checks={names!r} must list "
                                 f"checks of: {', '.join(sorted(known_checks))}")
            kinds[kind] = KindSettings(float(interval), tuple(names))
            if kind == "network":
                alerts, window = merged["alerts"], merged["window_s"]
                if isinstance(alerts, bool) or not isinstance(alerts, int) or alerts < 1:
                    raise UsageError(f"site config monitor.network.alerts={alerts!r} must "
                                     "be an integer >= 1")
                if isinstance(window, bool) or not isinstance(window, (int, float)) \
                        or window <= 0:
                    raise UsageError(f"site config monitor.network.window_s={window!r} "
                                     "must be a number > 0")
                extra = {"network_alerts": alerts, "network_window_s": float(window)}
        fatal = raw.get("fatal_checks", DEFAULT_FATAL)
        if not isinstance(fatal, list) or set(fatal) - known_checks:
            raise UsageError(f"site config monitor.fatal_checks={fatal!r} must list checks "
                             f"of: {', '.join(sorted(known_checks))}")
        return cls(enabled=enabled, fatal_checks=tuple(fatal), **kinds, **extra)


def xid_finding(xids: list[int]) -> tuple[Severity, str]:
    """A hardware Xid (the classifier's catalogue) is fatal; others are warnings."""
    hard = [x for x in xids if x in HARDWARE_XIDS]
    if hard:
        cls = IncidentClass.GPU_MEMORY_ERROR if hard[0] in XID_MEMORY \
            else IncidentClass.GPU_UNAVAILABLE
        return Severity.FATAL, cls
    return Severity.WARNING, IncidentClass.CUDA_ERROR


@dataclass
class _Kind:
    name: str
    settings: KindSettings
    due: float = 0.0
    last: dict[str, tuple[str, str]] = field(default_factory=dict)  # check -> (status, reason)


class NodeMonitor:
    """The monitor of one node; :meth:`start` runs it in a daemon thread, :meth:`run_due`
    runs one pass (tests and the benchmark drive it with their own clock)."""

    def __init__(self, node: str, job: str | None, site: SiteConfig,
                 settings: MonitorSettings | None = None, probes: Probes | None = None,
                 journal: bool = True, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.node, self.job, self.site = node, job, site
        self.settings = settings or MonitorSettings.from_site(site.monitor)
        self.state_dir = site.state_path(node)
        # No state_dir for the reader: the kernel-log Xid cursor belongs to the prolog and
        # epilog (root); the monitor follows the kernel log itself (the kernel kind) and
        # must not consume Xids the epilog's drain decision needs.
        self.probes = probes if probes is not None else \
            Probes(enabled_injections(self.state_dir, site.injection_enabled))
        self.journal = journal_path(node, site) if journal else None
        self.clock, self.wall = clock, wall
        self.run_id = f"monitor-{job or 'nojob'}-{os.getpid()}"
        s = self.settings
        self.kinds = {k: _Kind(k, getattr(s, k)) for k in DEFAULTS}
        registry = registered_checks()
        overrides = dict(site.checks)
        self.params = {name: registry[name].resolve_params(overrides.get(name, {}))
                       for kind in ("gpu", "network", "host")
                       for name in getattr(s, kind).checks}
        self.alerts: deque[tuple[float, str]] = deque()
        self.kernel_cursor: int | None = None
        self.kernel_unavailable: str | None = None
        self._ib_downed: dict[str, int] = {}
        self._ib_down_last: set[str] = set()
        self._net_bytes: tuple[float, int] | None = None
        self._rdma_bytes: tuple[float, int] | None = None
        self._lock = threading.Lock()
        self._findings: list[Finding] = []
        self._sample: NodeSample | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts: dict[str, int] = {Severity.WARNING: 0, Severity.FATAL: 0}

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        if not self.settings.enabled or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="robust-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_due(self.clock())
            except Exception:  # noqa: BLE001 - the monitor must never take the agent down
                log.exception("monitor pass failed on %s", self.node)
            wait = min(k.due for k in self.kinds.values()) - self.clock()
            self._stop.wait(max(0.05, min(wait, 1.0)))

    def take(self) -> tuple[list[Finding], NodeSample | None]:
        """The findings since the last call, and the newest sample (agent side)."""
        with self._lock:
            out, self._findings = self._findings, []
            return out, self._sample

    # ------------------------------------------------------------------ passes
    def run_due(self, now: float) -> list[Finding]:
        """Run every kind that is due at ``now`` (monotonic); returns the new findings."""
        found: list[Finding] = []
        refreshed = False
        for kind in self.kinds.values():
            if now < kind.due:
                continue
            kind.due = now + kind.settings.interval_s
            if not refreshed:
                self._refresh()
                refreshed = True
            if kind.name == "kernel":
                found += self._kernel()
            elif kind.name == "sample":
                self._take_sample(now)
            else:
                found += self._checks(kind, now)
        if found:
            self._record(found)
        return found

    def _refresh(self) -> None:
        """Re-read the node's injections: a rehearsal's ``inject probe`` mid-run reaches
        the long-lived reader without re-initialising NVML."""
        try:
            self.probes.injected = enabled_injections(self.state_dir,
                                                      self.site.injection_enabled)
        except RuntimeError as exc:  # a corrupt inject.json: keep the last good values
            log.warning("monitor on %s: %s", self.node, exc)

    def _ctx(self) -> CheckContext:
        return CheckContext(self.probes.view(), self.node, self.job, SUITE, self.site)

    def _checks(self, kind: _Kind, now: float) -> list[Finding]:
        out: list[Finding] = []
        for name in kind.settings.checks:
            result = run_check(registered_checks()[name], self._ctx(), self.params[name])
            if kind.name == "network":
                out += self._network(result, now)
                continue
            if result.status in (Status.OK, Status.SKIP):
                kind.last.pop(name, None)
                continue
            key = (result.status.value, result.reason)
            if kind.last.get(name) == key:
                continue  # the same condition as last round: already reported
            kind.last[name] = key
            out.append(self._finding(kind.name, result))
        return out

    def _finding(self, kind: str, result: CheckResult) -> Finding:
        severity, cls = Severity.WARNING, CHECK_CLASS.get(result.check)
        if result.status is Status.FAIL:
            if result.check == "gpu_xid":
                severity, cls = xid_finding([int(e["xid"]) for e in
                                             result.evidence.get("events", [])])
            elif result.check in self.settings.fatal_checks:
                severity = Severity.FATAL
                cls = cls or IncidentClass.GPU_UNAVAILABLE
        return Finding(kind=kind, check=result.check, severity=severity,
                       reason=result.reason or f"{result.check}: {result.status.value}",
                       time=self.wall(), cls=cls,
                       evidence={**result.evidence, "status": result.status.value,
                                 "injected": result.injected})

    def _network(self, result: CheckResult, now: float) -> list[Finding]:
        """Every failing round and every new ``link_downed`` count is an alert; the
        ``network_alerts``-th within ``network_window_s`` is fatal."""
        reasons = []
        if result.status is Status.FAIL:
            reasons.append(result.reason)
        ports = result.evidence.get("ports", []) if result.check == "net_ib_ports" else []
        down_now = set(result.evidence.get("down", []))
        for port in ports:
            name = port["port"]
            downed = port.get("errors", {}).get("link_downed")
            before = self._ib_downed.get(name)
            if downed is None:
                continue
            self._ib_downed[name] = downed
            # A down we saw ourselves (now or last round) is already an alert; only the
            # flaps that happened between two looks are counted from the counter.
            seen = 1 if name in down_now or name in self._ib_down_last else 0
            missed = (downed - before - seen) if before is not None else 0
            for n in range(missed):  # each flap is one alert
                reasons.append(f"net_ib_ports: port {name} went down between two checks "
                               f"(link_downed {before} -> {downed}, flap {n + 1} of "
                               f"{missed})")
        if result.check == "net_ib_ports":
            self._ib_down_last = down_now
        s = self.settings
        out = []
        for reason in reasons:
            self.alerts.append((now, reason))
            while self.alerts and now - self.alerts[0][0] > s.network_window_s:
                self.alerts.popleft()
            fatal = len(self.alerts) >= s.network_alerts
            evidence = {**result.evidence, "status": result.status.value,
                        "injected": result.injected, "alerts_in_window": len(self.alerts),
                        "window_s": s.network_window_s, "alerts_to_evict": s.network_alerts}
            out.append(Finding(kind="network", check=result.check,
                               severity=Severity.FATAL if fatal else Severity.WARNING,
                               reason=reason, time=self.wall(), cls=IncidentClass.NETWORK,
                               evidence=evidence))
            if fatal:
                self.alerts.clear()
        if result.status is Status.WARN and not reasons:
            key = (result.status.value, result.reason)
            last = self.kinds["network"].last
            if last.get(result.check) != key:
                last[result.check] = key
                out.append(self._finding("network", result))
        elif result.status is Status.OK:
            self.kinds["network"].last.pop(result.check, None)
        return out

    def _kernel(self) -> list[Finding]:
        if self.kernel_unavailable:
            return []
        try:
            lines = self.probes.view().get("kernel_log")
        except OSError as exc:
            # No /dev/kmsg access (containers): one warning, then the kind is off.
            self.kernel_unavailable = f"{type(exc).__name__}: {exc}"
            log.info("monitor on %s: kernel log not readable (%s)", self.node,
                     self.kernel_unavailable)
            return []
        if self.kernel_cursor is None:
            # Follow from now: what was logged before the job is the prolog's business.
            _, self.kernel_cursor = scan(lines, -1)
            return []
        events, self.kernel_cursor = scan(lines, self.kernel_cursor)
        return [self._kernel_finding(e) for e in events]

    def _kernel_finding(self, event: KernelEvent) -> Finding:
        if event.kind is KernelEventKind.XID:
            severity, cls = xid_finding([int(event.xid or 0)])
        else:
            cls = KERNEL_CLASS[event.kind]
            severity = Severity.FATAL if event.kind in FATAL_KERNEL else Severity.WARNING
        what = f"Xid {event.xid}" if event.kind is KernelEventKind.XID else event.kind.value
        evidence: KernelFindingEvidence = {"seq": event.seq, "line": event.text,
                                           "event": event.kind.value}
        if event.xid is not None:
            evidence.update(xid=event.xid, bus=event.bus)
        return Finding(kind="kernel", check=KIND_CHECK, severity=severity,
                       reason=f"{KIND_CHECK}: {what} in the kernel log: {event.text[:120]}",
                       time=self.wall(), cls=cls, evidence=dict(evidence))

    def _take_sample(self, now: float) -> None:
        view = self.probes.view()
        util = clock = None
        try:
            r = view.gpu("gpu_utilization", "sm_clock_mhz")
            util, clock = _mean(r["gpu_utilization"]), _mean(r["sm_clock_mhz"])
        except (NoNVMLError, NVMLHungError, Exception):  # noqa: BLE001 - a sample is optional
            pass
        rate = None
        try:
            total = sum(int(i.get("stats", {}).get("rx_bytes", 0)) +
                        int(i.get("stats", {}).get("tx_bytes", 0))
                        for i in view.get("net_ifaces") or [] if i.get("operstate") == "up")
            if self._net_bytes is not None and now > self._net_bytes[0]:
                rate = max(0, total - self._net_bytes[1]) / (now - self._net_bytes[0])
            self._net_bytes = (now, total)
        except (OSError, ValueError, TypeError):
            pass
        rdma = self._rdma_rate(view, now)
        with self._lock:
            self._sample = NodeSample(time=self.wall(), gpu_util=util, sm_clock_mhz=clock,
                                      net_bytes_per_s=None if rate is None else round(rate, 1),
                                      rdma_bytes_per_s=rdma)

    def _rdma_rate(self, view: Any, now: float) -> float | None:
        """Bytes per second through the node's RDMA ports since the last sample. On the
        nodes of a training job, RDMA ports carry the job's collectives and little else,
        so a silent port is evidence (ByteRobust's zero-RDMA rule); None without ports."""
        try:
            ports = view.get("ib_ports") or []
            words = [int(p.get("counters", {}).get(name, 0)) for p in ports
                     for name in ("port_xmit_data", "port_rcv_data")]
        except (OSError, ValueError, TypeError, AttributeError):
            return None
        if not ports:
            self._rdma_bytes = None
            return None
        total = 4 * sum(words)
        rate = None
        if self._rdma_bytes is not None and now > self._rdma_bytes[0]:
            rate = round(max(0, total - self._rdma_bytes[1]) / (now - self._rdma_bytes[0]), 1)
        self._rdma_bytes = (now, total)
        return rate

    # ------------------------------------------------------------------ records
    def _record(self, found: list[Finding]) -> None:
        for f in found:
            self.counts[f.severity] = self.counts.get(f.severity, 0) + 1
            log.log(logging.ERROR if f.severity is Severity.FATAL else logging.WARNING,
                    "monitor on %s: %s finding: %s", self.node, f.severity.value, f.reason)
        with self._lock:
            self._findings.extend(found)
        if self.journal is None:
            return
        results = [CheckResult(f.check, Status.FAIL if f.severity is Severity.FATAL
                               else Status.WARN, f.reason,
                               {**f.evidence, "kind": f.kind, "severity": f.severity.value,
                                "class": f.cls}, 0.0, bool(f.evidence.get("injected")))
                   for f in found]
        try:
            write_run(self.journal, make_records(self.node, self.job, SUITE, SUITE,
                                                 self.run_id, results, self.wall()))
        except OSError as exc:  # the journal is evidence; the finding still goes out
            log.warning("monitor on %s: journal not written: %s", self.node, exc)


def _mean(values: Any) -> float | None:
    nums = [float(v) for v in values or [] if isinstance(v, (int, float))
            and not isinstance(v, bool)]
    return round(sum(nums) / len(nums), 2) if nums else None


def start_monitor(node: str, job: str | None, site: SiteConfig) -> NodeMonitor | None:
    """The agent's monitor, started; None when the site turned it off. A bad ``monitor``
    section raises UsageError (the job fails at start with the reason)."""
    settings = MonitorSettings.from_site(site.monitor)
    if not settings.enabled:
        return None
    monitor = NodeMonitor(node, job, site, settings)
    monitor.start()
    return monitor
