"""``slurm-robust bench metrics``: what the live metrics cost a run.

Three numbers, in one process (no cluster needed):

- **step overhead**: a synthetic step (fixed pure-Python work that holds the GIL, like
  the controller's own threads do, calibrated to ``--step-ms``), A without metrics and B
  followed by ``RunMetrics.on_step``, interleaved step by step within each round (the
  order flips every pair), while a scraper thread fetches ``/metrics`` over HTTP every
  ``--scrape-every`` seconds. The worst case: in a real run the steps run in the worker
  processes and only the controller's thread pays. Reported: the median over rounds of
  each round's overhead of median step times, and the spread (min, max) over rounds.
  Target: < 1 %.
- **scrape latency** with ``--recorded`` steps (and some incidents) recorded: wall time of
  a full ``GET /metrics`` from a client, p50/p95/max. Target: p95 < 50 ms.
- **on_step cost**: mean microseconds per call, and the overhead it implies by
  accounting: (on_step + one scrape's p50 per ``--prom-interval`` of steps) / step time.
  On a shared machine the A/B spread is wide (other processes); the accounted figure is
  the steadier cross-check.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import urllib.request
from typing import Any

from slurm_robust.launcher.control.metrics import RunMetrics
from slurm_robust.launcher.enums import Category, Rung
from slurm_robust.launcher.messages import Incident

HELP = "cost of the live metrics: step-time overhead (A/B) and /metrics latency"
OVERHEAD_TARGET_PCT = 1.0
SCRAPE_TARGET_MS = 50.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=10, help="A/B pairs (default 10)")
    parser.add_argument("--steps", type=int, default=40, help="A/B step pairs per round")
    parser.add_argument("--step-ms", type=float, default=20.0, help="synthetic step time")
    parser.add_argument("--scrape-every", type=float, default=1.0,
                        help="seconds between scrapes during the rounds (Prometheus: 15 s)")
    parser.add_argument("--recorded", type=int, default=10_000,
                        help="steps recorded before timing scrapes")
    parser.add_argument("--scrapes", type=int, default=50,
                        help="/metrics requests timed (default 50)")
    parser.add_argument("--prom-interval", type=float, default=15.0,
                        help="scrape interval assumed by the accounted overhead")


def _work(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def _calibrate(step_ms: float) -> int:
    n = 20_000
    while True:
        t = time.perf_counter()
        _work(n)
        dt = time.perf_counter() - t
        if dt > 0.02:
            return max(1, int(n * step_ms / 1000.0 / dt))
        n *= 2


def _fetch(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as resp:
        resp.read()
    return time.perf_counter() - t


def _one(n_work: int, metrics: RunMetrics | None, step: int, last: float | None) -> float:
    t = time.perf_counter()
    _work(n_work)
    if metrics is not None:
        metrics.on_step(step, last, time.time())
    return time.perf_counter() - t


def _round(n_work: int, steps: int, metrics: RunMetrics, start_step: int,
           ) -> tuple[float, float]:
    """Median step time without (A) and with (B) metrics, A and B steps alternating (the
    order flips every pair) so that load from other processes hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for i in range(steps):
        for which in (("A", "B") if i % 2 == 0 else ("B", "A")):
            if which == "A":
                a.append(_one(n_work, None, 0, None))
            else:
                b.append(_one(n_work, metrics, start_step + i, b[-1] if b else None))
    return statistics.median(a), statistics.median(b)


def _overhead(args: argparse.Namespace) -> dict[str, Any]:
    n_work = _calibrate(args.step_ms)
    metrics = RunMetrics("bench", "bench")
    port = metrics.serve("127.0.0.1", _tmpdir(), 0)
    url = f"http://127.0.0.1:{port}/metrics"
    stop = threading.Event()
    scrapes = 0

    def scraper() -> None:
        nonlocal scrapes
        while not stop.wait(args.scrape_every):
            _fetch(url)
            scrapes += 1

    # The scraper runs through every round: its CPU lands on A and B steps alike, so the
    # A/B figure is on_step's cost; the scrape's own share is in accounted_overhead_pct.
    th = threading.Thread(target=scraper, daemon=True)
    th.start()
    pairs, a_meds, b_meds = [], [], []
    try:
        for r in range(args.rounds):
            a, b = _round(n_work, args.steps, metrics, r * args.steps)
            a_meds.append(a)
            b_meds.append(b)
            pairs.append((b - a) / a * 100.0)
    finally:
        stop.set()
        th.join()
        metrics.close()
    return {"step_ms_median_a": round(statistics.median(a_meds) * 1000, 3),
            "step_ms_median_b": round(statistics.median(b_meds) * 1000, 3),
            "overhead_pct_median": round(statistics.median(pairs), 3),
            "overhead_pct_spread": [round(min(pairs), 3), round(max(pairs), 3)],
            "scrapes_during_rounds": scrapes, "rounds": args.rounds,
            "steps_per_round": args.steps}


def _latency(args: argparse.Namespace) -> dict[str, Any]:
    metrics = RunMetrics("bench", "bench")
    t0 = time.time() - args.recorded * 0.1
    for i in range(args.recorded):
        metrics.on_step(i + 1, 0.1 if i else None, t0 + i * 0.1)
    for k, (cls, rung) in enumerate((("worker_crash", "in_place"), ("node_lost", "spare"),
                                     ("hang", "in_place"))):
        inc = Incident(incident=f"i{k}", category=Category.EXPLICIT, cls=cls,
                       rung=Rung(rung), fault_time=t0 + k, detected_at=t0 + k + 1,
                       localized_at=t0 + k + 2, recovered_at=t0 + k + 5,
                       restored_step=args.recorded, restore_tier="memory", steps_lost=0)
        metrics.on_incident(inc)
        metrics.on_recovered(inc)
    port = metrics.serve("127.0.0.1", _tmpdir(), 0)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        _fetch(url)  # the first connection sets up the server thread
        lat = sorted(_fetch(url) * 1000 for _ in range(args.scrapes))
    finally:
        metrics.close()
    n = 100_000
    m2 = RunMetrics("bench", "bench2")
    t = time.perf_counter()
    for i in range(n):
        m2.on_step(i, 0.1, t0 + i * 0.1)
    per_call = (time.perf_counter() - t) / n * 1e6
    return {"recorded_steps": args.recorded, "scrapes": args.scrapes,
            "scrape_ms_p50": round(lat[len(lat) // 2], 3),
            "scrape_ms_p95": round(lat[int(len(lat) * 0.95) - 1], 3),
            "scrape_ms_max": round(lat[-1], 3), "on_step_us_mean": round(per_call, 2)}


def _tmpdir() -> str:
    import tempfile
    return tempfile.mkdtemp(prefix="slurm-robust-bench-metrics-")


def run(args: argparse.Namespace) -> dict[str, Any]:
    latency = _latency(args)
    overhead = _overhead(args)
    targets = {"overhead_pct_median_lt": OVERHEAD_TARGET_PCT,
               "scrape_ms_p95_lt": SCRAPE_TARGET_MS}
    met = {"overhead": overhead["overhead_pct_median"] < OVERHEAD_TARGET_PCT,
           "scrape": latency["scrape_ms_p95"] < SCRAPE_TARGET_MS}
    step_ms = args.step_ms
    per_step_ms = latency["on_step_us_mean"] / 1000.0 + \
        latency["scrape_ms_p50"] * step_ms / (args.prom_interval * 1000.0)
    latency["accounted_overhead_pct"] = round(per_step_ms / step_ms * 100.0, 4)
    return {"benchmark": "metrics", **latency, **overhead, "targets": targets,
            "met": all(met.values()), "met_each": met}
