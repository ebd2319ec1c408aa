"""A run's live metrics: the controller's ``/metrics`` endpoint (Prometheus/OpenMetrics).

:class:`RunMetrics` owns a private ``prometheus_client`` registry. The controller calls
``on_step`` for every finished step, ``on_incident`` once the ladder decided a rung,
``on_recovered`` when the first step after the restore finished; phase and spares are
read at scrape time from callables given to ``watch``. Every sample carries the labels
``job_id`` and ``run_id``; other labels come from closed sets (class, category, rung,
tier, phase, window), cleaned by :func:`label_value`. Names: docs/METRICS.md.

What is exposed: numbers only (counts, durations, ratios, the step count). No paths, node
names, log lines, error text, config or environment. The endpoint binds to the job's own
node address (never 0.0.0.0); see docs/METRICS.md for who can reach it.

Service discovery: ``serve`` writes ``<run_dir>/metrics.json`` (where it listens) and,
when a discovery directory is configured, one Prometheus file-SD target file per run
there, removed again by ``close``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slurm_robust.launcher.control.live_ettr import LiveEttr
from slurm_robust.launcher.messages import Incident
from slurm_robust.metric_labels import label_value
from slurm_robust.metrics_server import BIND_ENV, BoundedMetricsServer, start_metrics_server
from slurm_robust.records import write_json_atomic

log = logging.getLogger("slurm_robust.launcher.control.metrics")

#: A Prometheus file-SD directory (``file_sd_configs``) the controller writes into.
SD_DIR_ENV = "SLURM_ROBUST_METRICS_SD_DIR"
#: Where the mini-cluster's Prometheus watches, under ``$SLURM_ROBUST_CLUSTER_DIR``.
CLUSTER_SD_SUBDIR = ("prometheus", "targets")
METRICS_FILE = "metrics.json"
METRICS_VERSION = 1

PHASES = ("gather", "running", "dumping", "requeued", "done")
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
RECOVERY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
                    600.0, 1800.0)
class RunMetrics:
    """The metrics of one run (see the module docstring). Thread-safe."""

    def __init__(self, job_id: str | None, run_id: str, started_at: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.job_id, self.run_id = str(job_id or "none"), run_id
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self._lock = threading.Lock()
        self._ettr = LiveEttr(clock() if started_at is None else started_at)
        self._last_step_at: float | None = None
        self._lag_max = 0.0
        self._server: BoundedMetricsServer | None = None
        self._sd_file: Path | None = None
        ids = ("job_id", "run_id")
        r = self.registry
        self.ettr = Gauge("slurm_robust_run_ettr_ratio", "Effective training time ratio: "
                          "productive step time over wall time", [*ids, "window"], registry=r)
        self.steps = Counter("slurm_robust_run_steps", "Steps finished by every rank "
                             "(redone steps count again)", ids, registry=r)
        self.last_step = Gauge("slurm_robust_run_last_step", "Newest finished step", ids,
                               registry=r)
        self.step_time = Histogram("slurm_robust_run_step_duration_seconds",
                                   "Wall time of one training step", ids,
                                   buckets=STEP_BUCKETS, registry=r)
        self.snapshot_age = Gauge("slurm_robust_run_snapshot_age_seconds", "Seconds since "
                                  "the newest per-step in-memory snapshot (the last finished "
                                  "step)", ids, registry=r)
        self.incidents = Counter("slurm_robust_run_incidents", "Incidents by class, "
                                 "category and ladder rung", [*ids, "class", "category", "rung"],
                                 registry=r)
        self.restarts = Counter("slurm_robust_run_restarts", "Restarts of the worker group "
                                "by rung (in_place, spare, requeue)", [*ids, "rung"], registry=r)
        self.detect = Histogram("slurm_robust_run_detect_seconds", "Fault to detection",
                                ids, buckets=RECOVERY_BUCKETS, registry=r)
        self.localize = Histogram("slurm_robust_run_localize_seconds",
                                  "Detection to localisation", ids, buckets=RECOVERY_BUCKETS,
                                  registry=r)
        self.recover = Histogram("slurm_robust_run_recover_seconds", "Fault (or detection "
                                 "when the fault time is unknown) to the first step after "
                                 "the restore", ids, buckets=RECOVERY_BUCKETS, registry=r)
        self.restores = Counter("slurm_robust_run_restores", "Recoveries by the slowest "
                                "checkpoint tier that served a rank", [*ids, "tier"], registry=r)
        self.steps_lost = Counter("slurm_robust_run_steps_lost", "Steps redone after "
                                  "rollbacks", ids, registry=r)
        self.spares = Gauge("slurm_robust_run_spares", "Spare nodes of the allocation: "
                            "parked (idle, ready) and used (replaced a blamed node)",
                            [*ids, "state"], registry=r)
        self.phase = Gauge("slurm_robust_run_phase", "1 for the controller's current phase",
                           [*ids, "phase"], registry=r)
        self.start_time = Gauge("slurm_robust_run_start_time_seconds", "Unix time this "
                                "controller started", ids, registry=r)
        # The controller's own lateness (control/overload.py): overload shows here and
        # as latency, never as a node declared lost.
        self.late = Counter("slurm_robust_controller_late_seconds", "Seconds the "
                            "controller's tick loop was late (beyond its normal pace)",
                            ids, registry=r)
        self.overloads = Counter("slurm_robust_controller_overloads", "Overload episodes: "
                                 "the tick loop at least 1 s late in one gap", ids,
                                 registry=r)
        self.lag_max = Gauge("slurm_robust_controller_lag_max_seconds", "The longest "
                             "lateness of the tick loop in one gap so far", ids, registry=r)
        self._ids = (self.job_id, self.run_id)
        self.late.labels(*self._ids)  # present (0) before any lateness
        self.overloads.labels(*self._ids)
        self.lag_max.labels(*self._ids).set(0.0)
        self.start_time.labels(*self._ids).set(self._ettr.started_at)
        for window, fn in (("cumulative", self._ettr.cumulative), ("1h", self._ettr.windowed)):
            self.ettr.labels(*self._ids, window).set_function(self._locked(fn))
        self.snapshot_age.labels(*self._ids).set_function(self._snapshot_age)
        self.steps.labels(*self._ids)  # present (0) before the first step
        self._step_hist = self.step_time.labels(*self._ids)
        self._steps = self.steps.labels(*self._ids)
        self._last = self.last_step.labels(*self._ids)

    # --------------------------------------------------------------- controller hooks
    def on_step(self, step: int, step_time_s: float | None, finished_at: float) -> None:
        """One step finished by every rank (O(1) amortised)."""
        with self._lock:
            self._ettr.step(step, step_time_s, finished_at)
            self._last_step_at = finished_at
        self._steps.inc()
        self._last.set(step)
        if step_time_s is not None:
            self._step_hist.observe(step_time_s)

    def on_incident(self, incident: Incident) -> None:
        """An incident whose rung is decided."""
        rung = label_value(incident.rung)
        self.incidents.labels(*self._ids, label_value(incident.cls),
                              label_value(incident.category), rung).inc()
        if rung != "stop":
            self.restarts.labels(*self._ids, rung).inc()
        fault, detected = incident.fault_time, incident.detected_at
        localized = incident.localized_at
        if fault is not None:
            self.detect.labels(*self._ids).observe(max(0.0, detected - fault))
        if localized is not None:
            self.localize.labels(*self._ids).observe(max(0.0, localized - detected))

    def on_recovered(self, incident: Incident) -> None:
        """The incident's recovery finished (``recovered_at``, ``restored_step`` set)."""
        start = incident.fault_time or incident.detected_at
        if incident.recovered_at is not None:
            self.recover.labels(*self._ids).observe(max(0.0, incident.recovered_at - start))
        self.restores.labels(*self._ids, label_value(incident.restore_tier)).inc()
        self.steps_lost.labels(*self._ids).inc(max(0, int(incident.steps_lost or 0)))
        with self._lock:
            self._ettr.rollback(incident.restored_step)

    def on_lateness(self, lag_s: float, episode: bool) -> None:
        """The controller's tick loop was ``lag_s`` late in one gap (``episode``: an
        overload episode)."""
        self.late.labels(*self._ids).inc(lag_s)
        if episode:
            self.overloads.labels(*self._ids).inc()
        gauge = self.lag_max.labels(*self._ids)
        with self._lock:
            self._lag_max = max(self._lag_max, lag_s)
            gauge.set(self._lag_max)

    def watch(self, phase: Callable[[], str] | None = None,
              spares_parked: Callable[[], int] | None = None,
              spares_used: Callable[[], int] | None = None) -> None:
        """Values read at scrape time (cheap attribute reads of the controller)."""
        if phase is not None:
            for p in PHASES:
                self.phase.labels(*self._ids, p).set_function(
                    lambda p=p: 1.0 if phase() == p else 0.0)
        for state, fn in (("parked", spares_parked), ("used", spares_used)):
            if fn is not None:
                self.spares.labels(*self._ids, state).set_function(fn)

    def set_phase(self, phase: str) -> None:
        """For callers without a phase attribute to watch: set the phase directly."""
        for p in PHASES:
            self.phase.labels(*self._ids, p).set(1.0 if p == phase else 0.0)

    # --------------------------------------------------------------- serving
    def serve(self, host: str, run_dir: str | os.PathLike[str], port: int = 0,
              sd_dir: str | os.PathLike[str] | None = None) -> int:
        """Listen on ``host:port`` (0: any free port); record where; returns the port.

        The server is bounded (metrics_server.py: a connection cap, a total deadline per
        connection, one thread), so strangers who reach the port cannot exhaust the
        descriptors of the agent that hosts the controller. ``$SLURM_ROBUST_METRICS_BIND``
        overrides the address (for a site whose Prometheus reaches another network)."""
        host = os.environ.get(BIND_ENV) or host
        server = start_metrics_server(self.registry, host, port)
        self._server = server
        port = int(server.server_port)
        target = {"host": host, "port": port, "path": "/metrics", "job_id": self.job_id,
                  "run_id": self.run_id, "v": METRICS_VERSION, "time": self.clock()}
        write_json_atomic(Path(run_dir) / METRICS_FILE, target, mode=0o644)
        sd = Path(sd_dir) if sd_dir is not None else None
        if sd is not None:
            name = re.sub(r"[^0-9A-Za-z_-]", "_", f"{self.job_id}-{self.run_id}")
            self._sd_file = sd / f"{name}.json"
            write_json_atomic(self._sd_file, [{"targets": [f"{host}:{port}"],
                                               "labels": {"slurm_robust_run": "1"}}],
                              mode=0o644)
        log.info("metrics on http://%s:%d/metrics", host, port)
        return port

    def close(self) -> None:
        """Stop serving and withdraw the discovery target (the run is over)."""
        if self._sd_file is not None:
            self._sd_file.unlink(missing_ok=True)
            self._sd_file = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --------------------------------------------------------------- helpers
    def _locked(self, fn: Callable[[float], float]) -> Callable[[], float]:
        def read() -> float:
            with self._lock:
                return fn(self.clock())
        return read

    def _snapshot_age(self) -> float:
        with self._lock:
            last = self._last_step_at
        return float("nan") if last is None else max(0.0, self.clock() - last)


def sd_dir_from_env(env: Mapping[str, str] | None = None) -> Path | None:
    """The file-SD directory: ``$SLURM_ROBUST_METRICS_SD_DIR``, else the mini-cluster's
    (``$SLURM_ROBUST_CLUSTER_DIR/prometheus/targets``) when it exists, else None."""
    e = os.environ if env is None else env
    if e.get(SD_DIR_ENV):
        return Path(e[SD_DIR_ENV])
    cluster = e.get("SLURM_ROBUST_CLUSTER_DIR")
    if cluster:
        path = Path(cluster).joinpath(*CLUSTER_SD_SUBDIR)
        if path.is_dir():
            return path
    return None


def serve_for_controller(metrics: RunMetrics, run_dir: str | os.PathLike[str], host: str,
                         port: int = 0) -> RunMetrics:
    """Serve a run's metrics.

    Metrics must never stop a training run: when the endpoint cannot start (a busy port,
    an unwritable discovery directory) that is logged, and the metrics are still kept in
    memory (the hooks stay valid) but not served.
    """
    try:
        metrics.serve(host, run_dir, port, sd_dir_from_env())
    except OSError as exc:
        log.warning("metrics endpoint not started (%s); the run continues without it", exc)
        metrics.close()
    return metrics
