"""How a controller's run ended: what :meth:`Controller.join` hands to its agent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from slurm_robust.launcher.enums import RunStatus


class OutcomeSummary(TypedDict, total=False):
    """What :meth:`RunOutcome.summary` gives an agent's summary."""

    status: RunStatus
    verdict: str | None
    step: int | None
    params_sha256: str | None
    attempt: int | None
    restarts: int | None
    term: int | None


@dataclass(frozen=True)
class RunOutcome:
    """The run's end as this controller saw it. ``step``/``params_sha256``: the last
    finished step and rank 0's final digest; ``term``: set when it stood down."""

    status: RunStatus
    verdict: str | None = None
    step: int | None = None
    params_sha256: str | None = None
    attempt: int | None = None
    restarts: int | None = None
    term: int | None = None

    def summary(self) -> OutcomeSummary:
        """The fields an agent's summary carries (a stood-down controller's: its term)."""
        if self.status is RunStatus.STOOD_DOWN:
            return {"status": self.status, "term": self.term, "verdict": self.verdict}
        return {"status": self.status, "verdict": self.verdict, "step": self.step,
                "params_sha256": self.params_sha256, "attempt": self.attempt,
                "restarts": self.restarts}
