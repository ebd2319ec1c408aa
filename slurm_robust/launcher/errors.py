"""The launcher's exceptions."""

from __future__ import annotations

from slurm_robust.errors import SlurmRobustError, UsageError


class LauncherError(SlurmRobustError):
    """A robust run could not be started or followed."""


class RunStopped(LauncherError):
    """The run stopped with a verdict (futile restarts, no progress, budget spent).

    Raised by agent 0 so that the Slurm job ends FAILED and ``job.result()`` re-raises
    it with the verdict; the event log's ``run_end`` record carries the same verdict.
    """

    def __init__(self, verdict: str, run_dir: str) -> None:
        super().__init__(f"run stopped: {verdict} (event log: {run_dir}/events.jsonl)")
        self.verdict = verdict
        self.run_dir = run_dir

    def __reduce__(self):  # submitit pickles the exception back to the submitter
        return (RunStopped, (self.verdict, self.run_dir))


class InjectionError(UsageError):
    """A fault could not be injected (no such job, node or rank; not allowed here)."""
