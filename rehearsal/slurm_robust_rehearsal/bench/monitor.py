"""``slurm-robust bench monitor``: the in-job monitor's CPU cost and detection latency.

Runs one node's real monitor (``slurm_robust.launcher.node.monitor``, the default
schedule or the site's, real probes: sysfs, ``/dev/kmsg`` where readable, NVML where
present) in this process, against a throw-away state directory:

1. CPU share: after a warm-up (the first pass, reported as ``startup_cpu_s``), for
   ``--period`` seconds nothing else runs in the process, so the process's
   CPU time (``getrusage``: the monitor thread and the threads its checks run in) over
   the period is the monitor's cost on one node. Target: < 1 % of one core.
   The kernel kind reads the real ``/dev/kmsg`` during this period (where readable).
2. Detection latency per kind: one fault per kind is injected through the node's
   inject.json (the path ``slurm-robust inject probe`` writes) at the same moment -- a
   hardware Xid (gpu), an Xid line in the kernel log (kernel), a port going down (network:
   its first alert; the eviction needs the second, one interval later), low memory
   (host) -- and the time until the monitor hands each finding out is measured. Targets:
   the kind's interval plus one second (ByteRobust: GPU 10 s, kernel 2 s, network and
   host 30 s).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from typing import Any

from slurm_robust.errors import SlurmRobustError
from slurm_robust.launcher.node.monitor import MonitorSettings, NodeMonitor
from slurm_robust.site_config import SiteConfig, load_site_config
from slurm_robust_rehearsal.inject.probes import inject_probe

HELP = "the in-job monitor's CPU share per node and its detection latency per check kind"
TARGET_CPU_SHARE = 0.01
NODE = "benchnode"
#: Slack on top of a kind's interval for its detection target.
LATENCY_SLACK_S = 1.0
#: Seconds given to the first pass before the steady-state period starts.
WARMUP_S = 3.0
KERNEL_XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
FAULTS: dict[str, tuple[str, Any]] = {
    "gpu": ("xid_events", [{"gpu": 0, "xid": 79}]),
    "kernel": ("kernel_log", None),  # a line after the real log's newest (see _latency)
    "network": ("ib_ports", [{"device": "mlx5_0", "port": 1, "state": "DOWN",
                              "phys_state": "Polling", "rate": "200 Gb/sec",
                              "counters": {"link_downed": 1}}]),
    "host": ("mem_available_bytes", 1),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--period", type=float, default=60.0,
                        help="seconds of CPU measurement (default 60)")
    parser.add_argument("--no-latency", action="store_true",
                        help="measure the CPU share only")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.period <= 0:
        raise SlurmRobustError("--period must be > 0")
    site_monitor = load_site_config().monitor
    settings = MonitorSettings.from_site(site_monitor)
    with tempfile.TemporaryDirectory(prefix="slurm_robust_bench_monitor_") as tmp:
        site = SiteConfig(state_dir=f"{tmp}/{{node}}", injection_enabled=True,
                          monitor=dict(site_monitor))
        site.state_path(NODE).mkdir(parents=True)
        monitor = NodeMonitor(NODE, "bench", site, settings)
        monitor.start()
        try:
            # The first pass loads NVML (or finds it absent) and reads every source once:
            # a one-off at agent start, reported apart from the steady share.
            startup = _cpu_share(WARMUP_S)
            cpu = _cpu_share(args.period)
            latency = {} if args.no_latency else _latency(site, monitor, settings)
        finally:
            monitor.stop()
    passes = {k: int(args.period // getattr(settings, k).interval_s) + 1
              for k in ("gpu", "kernel", "network", "host", "sample")}
    out: dict[str, Any] = {
        "benchmark": "monitor", "startup_cpu_s": round(startup, 4),
        "period_s": args.period, "cpu_s": round(cpu, 4),
        "cpu_share": round(cpu / args.period, 6), "target_cpu_share": TARGET_CPU_SHARE,
        "passes_in_period": passes,
        "kernel_log_readable": monitor.kernel_unavailable is None,
        "intervals_s": {k: getattr(settings, k).interval_s
                        for k in ("gpu", "kernel", "network", "host", "sample")},
        "loadavg_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    met = cpu / args.period < TARGET_CPU_SHARE
    if latency:
        out["detection_s"] = latency
        # One injection at one phase of each schedule: the worst case is the interval.
        out["detection_targets_s"] = {k: getattr(settings, k).interval_s + LATENCY_SLACK_S
                                      for k in FAULTS}
        if monitor.kernel_unavailable is not None:
            del latency["kernel"], out["detection_targets_s"]["kernel"]
        out["network_eviction_bound_s"] = round(
            settings.network.interval_s * (settings.network_alerts - 1)
            + (latency.get("network") or 0.0), 3)
        met = met and all(v is not None and v <= out["detection_targets_s"][k]
                          for k, v in latency.items())
    out["met"] = met
    return out


def _cpu_share(period: float) -> float:
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(period)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _latency(site: SiteConfig, monitor: NodeMonitor,
             settings: MonitorSettings) -> dict[str, float | None]:
    monitor.take()
    start = time.monotonic()
    for probe, value in FAULTS.values():
        if probe == "kernel_log":
            # After the newest record the monitor read from the real log (its cursor).
            seq = (monitor.kernel_cursor or 0) + 1
            value = [f"3,{seq},0,-;{KERNEL_XID}"]
        inject_probe(site, NODE, probe, value)
    seen: dict[str, float | None] = {k: None for k in FAULTS}
    deadline = start + max(getattr(settings, k).interval_s for k in FAULTS) + 5.0
    while time.monotonic() < deadline and any(v is None for v in seen.values()):
        findings, _ = monitor.take()
        now = time.monotonic()
        for f in findings:
            if f.kind in seen and seen[f.kind] is None:
                seen[f.kind] = round(now - start, 3)
        time.sleep(0.05)
    return seen

