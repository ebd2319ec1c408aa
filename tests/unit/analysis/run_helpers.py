"""A run directory with the records a two-node run writes before anything happens to it,
for the analysis tests that add their own events on top."""

from __future__ import annotations

from pathlib import Path

from slurm_robust.launcher.control.events import EventLog


def started_run(tmp_path: Path, steps: int = 5) -> tuple[Path, EventLog]:
    """``tmp_path/run`` with run_start (n1, n2) at 99 s, attempt_start at 100 s and steps
    1..``steps`` of 1 s each; the event log to write more into."""
    run = tmp_path / "run"
    run.mkdir()
    log = EventLog(run / "events.jsonl", "r1", "7", 0, 1000.0)
    log.emit("run_start", {"nodes": ["n1", "n2"], "spares": [], "world_size": 2}, now=99.0)
    log.emit("attempt_start", {"nodes": ["n1", "n2"], "restored_step": None}, now=100.0)
    for step in range(1, steps + 1):
        log.step(step, 1.0, 0.5, 1.0, force=True, now=100.0 + step)
    return run, log
