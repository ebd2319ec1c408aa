"""``slurm-robust exporter``: serve the health/reserve metrics for Prometheus.

One process per cluster, on the slurmctld host (it reads the reserve from Slurm and the
logs EpilogSlurmctld writes). See slurm_robust/reserve/metrics.py and docs/METRICS.md.
"""

from __future__ import annotations

import argparse
import signal
import threading

from slurm_robust.errors import UsageError

HELP = "serve health-check, drain, verdict and warm-reserve metrics on /metrics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:9851",
                        help="HOST:PORT to bind (default 127.0.0.1:9851; bind an address "
                             "your Prometheus reaches, never a public one)")
    parser.add_argument("--config", help="site config (default $SLURM_ROBUST_CONFIG or "
                                         "/etc/slurm_robust/config.json)")
    parser.add_argument("--min-interval", type=float, default=15.0,
                        help="seconds between refreshes; scrapes in between get the cache")


def run(args: argparse.Namespace) -> int:
    # Lazy: `slurm-robust --help` imports every subcommand module; prometheus_client
    # and the reserve's readers are needed only when the exporter runs.
    from prometheus_client import CollectorRegistry

    from slurm_robust.launcher.paths import site_config_path
    from slurm_robust.metrics_server import start_metrics_server
    from slurm_robust.reserve.metrics import ReserveCollector, cluster_refresh

    host, sep, port = args.listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--listen {args.listen!r} is not HOST:PORT")
    registry = CollectorRegistry(auto_describe=False)
    collector = ReserveCollector(cluster_refresh(site_config_path(args.config)),
                                 args.min_interval)
    collector.view()  # a broken config fails here, at start, not at the first scrape
    registry.register(collector)
    # Bounded (a connection cap and a deadline per connection): metrics_server.py.
    server = start_metrics_server(registry, host, int(port))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"slurm-robust exporter on http://{host}:{server.server_port}/metrics", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0
