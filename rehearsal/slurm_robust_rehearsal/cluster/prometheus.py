"""An opt-in Prometheus server and the reserve exporter for the mini-cluster.

``cluster up --prometheus`` starts, beside the Slurm daemons, Debian's ``prometheus``
(bound to 127.0.0.1) and ``slurm-robust exporter``. Prometheus finds the running robust
jobs through file-based service discovery: each job's controller writes one target file
into ``<cluster>/prometheus/targets/`` (world-writable and sticky, like the shared
directory: the jobs run as the test user) and removes it at the end. Both processes carry
the cluster marker, so ``cluster down`` stops them with the rest.

Opt-in because it adds a package and two processes to a start-up that most tests do not
need. The alerting rules of docs/prometheus/alerts.yml are loaded when present.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from slurm_robust_rehearsal.cluster.config import REPO_ROOT, ClusterConfig
from slurm_robust_rehearsal.cluster.daemons import Daemon, start_daemon, tail, wait_for

PACKAGE = ("prometheus", "/usr/bin/prometheus")
PROMETHEUS_PORT = 19090
EXPORTER_PORT = 19851
SCRAPE_INTERVAL_S = 2
ALERTS = REPO_ROOT / "docs" / "prometheus" / "alerts.yml"


def prom_dir(cfg: ClusterConfig) -> Path:
    return cfg.root / "prometheus"


def targets_dir(cfg: ClusterConfig) -> Path:
    return prom_dir(cfg) / "targets"


def url(path: str = "") -> str:
    return f"http://127.0.0.1:{PROMETHEUS_PORT}{path}"


def render_config(cfg: ClusterConfig) -> str:
    """prometheus.yml (JSON is valid YAML: no YAML library needed to write it)."""
    conf = {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s",
                   "evaluation_interval": f"{SCRAPE_INTERVAL_S}s"},
        "rule_files": [str(ALERTS)] if ALERTS.exists() else [],
        "scrape_configs": [
            {"job_name": "slurm_robust_runs",
             "file_sd_configs": [{"files": [str(targets_dir(cfg) / "*.json")],
                                  "refresh_interval": f"{SCRAPE_INTERVAL_S}s"}]},
            {"job_name": "slurm_robust_exporter",
             "static_configs": [{"targets": [f"127.0.0.1:{EXPORTER_PORT}"]}]},
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def daemons(cfg: ClusterConfig) -> list[Daemon]:
    d = prom_dir(cfg)
    return [
        Daemon("prometheus", ("prometheus", f"--config.file={d / 'prometheus.yml'}",
                              f"--storage.tsdb.path={d / 'data'}",
                              "--storage.tsdb.retention.time=1d",
                              f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}"),
               cfg.run_dir / "mc-prometheus.pid", cfg.log_dir / "prometheus.out"),
        Daemon("exporter", (cfg.python, "-m", "slurm_robust.cli.main", "exporter",
                            "--listen", f"127.0.0.1:{EXPORTER_PORT}",
                            "--config", str(cfg.robust_conf), "--min-interval", "2"),
               cfg.run_dir / "mc-exporter.pid", cfg.log_dir / "exporter.out"),
    ]


def start(cfg: ClusterConfig, env: dict[str, str]) -> None:
    """Write the config and start both (idempotent: running ones are left alone)."""
    d = prom_dir(cfg)
    (d / "data").mkdir(parents=True, exist_ok=True)
    targets_dir(cfg).mkdir(parents=True, exist_ok=True)
    targets_dir(cfg).chmod(0o1777)
    (d / "prometheus.yml").write_text(render_config(cfg))
    for daemon in daemons(cfg):
        start_daemon(daemon, cfg.root, env)
    wait_for("prometheus", _ready, 60, hint=tail(cfg.log_dir / "prometheus.out"))


def _ready() -> bool:
    with urllib.request.urlopen(url("/-/ready"), timeout=2) as resp:
        return resp.status == 200
