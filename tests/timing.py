"""The suite's time budget, printed at the end of every run (``make test``'s last lines).

One block: the session's wall time, the mini-cluster's set-up (``up`` plus the smoke job,
once per session, or once per pytest-xdist worker, each with its own cluster) and the
slowest tests, each with its set-up, call and teardown added
up, since a test's cluster waits often sit in its fixtures. The budget is 25 minutes for
``make test`` on a 2-core machine; this block is where a test that grew shows first.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

SLOWEST = 20
#: Every test's seconds, slowest first, written at the end of each run (one file per
#: selection: ``unit`` or ``integration``; see ``make test``) for profiling the suite.
TIMINGS_FILE = ".test-timings-{kind}.json"
#: The user property a worker's first cluster test carries its cluster's set-up time in.
CLUSTER_SETUP_PROPERTY = "minicluster_setup_s"


class TimingSummary:
    """A pytest plugin: sums each test's phases and prints the summary block."""

    def __init__(self) -> None:
        self.started = process_start_monotonic()
        self.per_test: dict[str, float] = defaultdict(float)
        self.cluster_setup_s: list[float] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.per_test[report.nodeid] += report.duration
        if report.when == "teardown":
            self.cluster_setup_s += [float(v) for k, v in report.user_properties
                                     if k == CLUSTER_SETUP_PROPERTY]

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001
        total = time.monotonic() - self.started
        tr = terminalreporter
        tr.write_sep("=", "timing summary")
        setup = (", ".join(f"{s:.1f} s" for s in self.cluster_setup_s)
                 or "not started")
        tr.write_line(f"total {total:.1f} s ({total / 60:.1f} min); mini-cluster set-up "
                      f"{setup}; {len(self.per_test)} tests")
        slowest = sorted(self.per_test.items(), key=lambda kv: kv[1], reverse=True)
        for nodeid, seconds in slowest[:SLOWEST]:
            tr.write_line(f"{seconds:8.1f} s  {nodeid}")
        self._write_all(tr.config, total, slowest)

    def _write_all(self, config: pytest.Config, total: float,
                   slowest: list[tuple[str, float]]) -> None:
        if hasattr(config, "workerinput") or not slowest:
            return  # an xdist worker: the controller process has every report
        markexpr = config.getoption("markexpr", "") or ""
        kind = {"not integration": "unit", "integration": "integration"}.get(markexpr, "all")
        path = config.rootpath / TIMINGS_FILE.format(kind=kind)
        try:
            path.write_text(json.dumps({"total_s": round(total, 1), "tests": [
                {"test": nodeid, "seconds": round(seconds, 2)} for nodeid, seconds in slowest]},
                indent=0) + "\n")
        except OSError:
            pass  # a read-only checkout still gets the summary above


def process_start_monotonic() -> float:
    """When this process started, on the monotonic clock: the total then includes
    interpreter start, imports and collection, which a plugin registered by a conftest
    would miss (Linux /proc; elsewhere: now)."""
    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic()
    # /proc's start time counts from boot on CLOCK_BOOTTIME (which, unlike the monotonic
    # clock, goes on while a VM is paused), so the age is taken on that clock.
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_after_boot
    return time.monotonic() - age
