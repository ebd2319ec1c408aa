"""Features that follow the run without owning it: each hooks into the applier's moments.

The applier (applier.py) is the one writer of the run's state; a feature that needs to
know a step finished, a generation started or an incident was decided implements the
hooks it needs of :class:`Listener` and is called from there, once per moment, in the
order the listeners were given. A hook never changes the run's phase, generation, plans
or spares: what a feature wants done to the run it says through a detector's action.
"""

from __future__ import annotations

from collections.abc import Callable

from slurm_robust.launcher.config import RunConfig
from slurm_robust.launcher.control import failslow
from slurm_robust.launcher.control.generation import Generation, restored_of
from slurm_robust.launcher.control.hot_update import HotUpdate
from slurm_robust.launcher.control.ladder import Decision
from slurm_robust.launcher.control.metrics import RunMetrics
from slurm_robust.launcher.control.monitor import NodeFindings
from slurm_robust.launcher.control.nan_ladder import NanLadder, NanResolution, write_skips
from slurm_robust.launcher.control.state import RunState
from slurm_robust.launcher.messages import Incident
from slurm_robust.stacks.failslow import FailSlowMonitor


class Listener:
    """The applier's moments; each does nothing unless a feature overrides it."""

    def on_step(self, gen: Generation, step: int, step_time: float | None,
                finished_at: float, now: float) -> None:
        """Every rank finished ``step`` (``step_time``: since the previous one)."""

    def on_step_recorded(self, gen: Generation, step: int, now: float) -> None:
        """``step`` is in the event log, and so is the incident it recovered, if any."""

    def before_generation(self, last_step: int | None, now: float) -> None:
        """A restart is about to start a new generation (not the run's first start)."""

    def on_generation(self, gen: Generation, rank_nodes: list[str], now: float) -> None:
        """``gen`` started (or a successor took it over) with ranks on ``rank_nodes``."""

    def on_decision(self, incident: Incident, decision: Decision, last_step: int | None,
                    now: float) -> None:
        """The ladder decided ``incident`` (before the decision is stamped on it)."""

    def on_incident(self, incident: Incident) -> None:
        """``incident`` has its rung (it is being applied)."""

    def on_recovered(self, incident: Incident) -> None:
        """``incident`` recovered: the first step after the restore finished."""

    def on_persist(self, state: RunState) -> None:
        """state.json is about to be written: a feature's own part of it goes in."""


class MetricsListener(Listener):
    """Live metrics (docs/METRICS.md): steps, incidents and recoveries as they happen."""

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics

    def on_step(self, gen: Generation, step: int, step_time: float | None,
                finished_at: float, now: float) -> None:
        self.metrics.on_step(step, step_time, finished_at)

    def on_incident(self, incident: Incident) -> None:
        self.metrics.on_incident(incident)

    def on_recovered(self, incident: Incident) -> None:
        self.metrics.on_recovered(incident)


class HotUpdateListener(Listener):
    """Hot update (hot_update.py): a staged update goes at the next restart, a failure of
    the new version rolls it back, and its downtime ends at the first step after."""

    def __init__(self, hot: HotUpdate) -> None:
        self.hot = hot

    def before_generation(self, last_step: int | None, now: float) -> None:
        self.hot.on_restart(last_step, now)

    def on_decision(self, incident: Incident, decision: Decision, last_step: int | None,
                    now: float) -> None:
        if decision.rollback is not None:
            # The new version's own failure: back to the previous one, restarted in place.
            self.hot.roll_back(decision.rollback, last_step, now)
            incident.evidence["rollback"] = decision.rollback

    def on_step_recorded(self, gen: Generation, step: int, now: float) -> None:
        self.hot.on_step(step, restored_of(gen), now)


class NanListener(Listener):
    """The NaN ladder (nan_ladder.py) counts finished steps to end a NaN episode, and a
    batch it decided to skip reaches the workers' skip file before their next start."""

    def __init__(self, ladder: Callable[[], NanLadder], run_dir: str) -> None:
        self.ladder = ladder
        self.run_dir = run_dir

    def on_decision(self, incident: Incident, decision: Decision, last_step: int | None,
                    now: float) -> None:
        nan = incident.evidence.get("nan")
        if isinstance(nan, dict) and nan.get("resolution") == NanResolution.SKIP:
            write_skips(self.run_dir, self.ladder().skipped)

    def on_step(self, gen: Generation, step: int, step_time: float | None,
                finished_at: float, now: float) -> None:
        self.ladder().on_step(step)

    def on_persist(self, state: RunState) -> None:
        state.nan_ladder = self.ladder().to_state()


class MonitorListener(Listener):
    """Per-generation watchers: the script-fed fail-slow vote (failslow.py) and the
    in-job monitor's findings (monitor.py) start over with each generation's ranks."""

    def __init__(self, cfg: RunConfig, findings: NodeFindings) -> None:
        self.cfg = cfg
        self.findings = findings
        self.failslow: FailSlowMonitor | None = None  # one per generation

    def on_generation(self, gen: Generation, rank_nodes: list[str], now: float) -> None:
        self.failslow = failslow.new_monitor(self.cfg, rank_nodes)
        self.findings.new_generation(self.cfg, rank_nodes)
