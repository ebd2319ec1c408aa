"""Slurm actions that never block the control loop, and survive a slurmctld outage.

The controller answers every agent under one lock; a Slurm command that waits for an
unreachable or busy slurmctld must never run under it, or the agents' heartbeats time out
and a healthy node is blamed. So recovery starts each Slurm action
(requeue, drain) as a :class:`SlurmAction`: a worker thread that runs the call, while the
recovery owner polls :meth:`SlurmAction.outcome` on its tick.

Retry budget: "slurmctld unreachable", "busy", a timed-out command and Slurm 22.05's
"Unexpected message received" (an answer lost in a restart) are transient. They are
retried with exponential backoff (1 s doubling to at most 10 s) for
:func:`retry_budget_s` seconds: Slurm's own ``SlurmctldTimeout`` (read once from
``scontrol show config``; 120 s, Slurm's default, when it cannot be read), the time Slurm
itself gives a backup controller to take over. Any other refusal fails at once.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_robust.slurm import SlurmCommandError
from slurm_robust.slurm.runner import RetryPolicy, is_transient, run_slurm_command

log = logging.getLogger("slurm_robust.launcher.control.slurm_actions")

#: Slurm's default ``SlurmctldTimeout``: the budget when the config cannot be read.
DEFAULT_CTLD_TIMEOUT_S = 120.0
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 10.0

#: Not in the runner's list because a plain command must not repeat on it: slurmctld
#: 22.05 answers this when a reply was lost across its restart, so the request may
#: have been applied. Callers that repeat on it check the outcome first (requeue_job).
EXTRA_TRANSIENT = ("unexpected message received", "unable to contact slurm controller")

_budget_lock = threading.Lock()
_budget: float | None = None


class ActionState(enum.StrEnum):
    """Where a :class:`SlurmAction` stands."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


def transient(exc: SlurmCommandError) -> bool:
    """Whether a failed Slurm command is worth repeating (slurmctld away or busy)."""
    if exc.timed_out:
        return True
    text = f"{exc.stderr} {exc}".lower()
    return is_transient(text) or any(m in text for m in EXTRA_TRANSIENT)


def parse_ctld_timeout(config_text: str) -> float | None:
    """``SlurmctldTimeout = 120 sec`` from ``scontrol show config`` output."""
    m = re.search(r"^\s*SlurmctldTimeout\s*=\s*(\d+)", config_text, re.MULTILINE)
    return float(m.group(1)) if m else None


def retry_budget_s() -> float:
    """Seconds to keep retrying a transient failure (see the module docstring).

    Read once per process; called from an action's thread, never under the lock."""
    global _budget
    with _budget_lock:
        if _budget is None:
            value: float | None = None
            try:
                proc = run_slurm_command(["scontrol", "show", "config"],
                                         policy=RetryPolicy(attempts=1, timeout_s=10))
                value = parse_ctld_timeout(proc.stdout)
            except Exception as exc:  # noqa: BLE001 - the default budget is the fallback
                log.info("SlurmctldTimeout unknown (%s); retry budget %g s", exc,
                         DEFAULT_CTLD_TIMEOUT_S)
            _budget = max(value or DEFAULT_CTLD_TIMEOUT_S, 1.0)
        return _budget


def retry_transient(call: Callable[[], Any], what: str, budget_s: float | None = None, *,
                    settled: Callable[[], bool] | None = None,
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> Any:
    """Run ``call``; repeat it on a transient SlurmCommandError within the budget.

    ``settled`` (optional) is asked after every failure whether the wanted effect is
    already there (a request applied although its answer was lost); then the failure is
    forgiven and None returned. Raises the last error when it is not transient or the
    budget is spent."""
    budget = retry_budget_s() if budget_s is None else budget_s
    deadline = clock() + budget
    delay = FIRST_DELAY_S
    tries = 0
    while True:
        tries += 1
        try:
            return call()
        except SlurmCommandError as exc:
            if settled is not None and _safe(settled):
                log.warning("%s: Slurm said %s, but it was applied", what, exc)
                return None
            if not transient(exc) or clock() + delay > deadline:
                log.warning("%s failed after %d tries (budget %g s): %s", what, tries,
                            budget, exc)
                raise
            log.warning("%s: slurmctld not answering (try %d), again in %.0f s: %s",
                        what, tries, delay, exc)
            sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)


def _safe(check: Callable[[], bool]) -> bool:
    try:
        return bool(check())
    except SlurmCommandError:
        return False  # slurmctld still away: unknown, so not settled


@dataclass
class Outcome:
    """How a finished action went (``error`` is None when it succeeded)."""

    state: ActionState
    error: str | None = None
    started: float = 0.0
    ended: float = 0.0


class SlurmAction:
    """One Slurm call in a daemon thread; :meth:`outcome` is polled, never waited on."""

    def __init__(self, name: str, call: Callable[[], object],
                 clock: Callable[[], float] = time.time) -> None:
        self.name = name
        self._call = call
        self._clock = clock
        self._outcome = Outcome(ActionState.RUNNING, started=clock())
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"robust-slurm-{name}")

    def start(self) -> SlurmAction:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._call()
            state, error = ActionState.DONE, None
        except Exception as exc:  # noqa: BLE001 - the owner decides what a failure means
            state, error = ActionState.FAILED, str(exc) or type(exc).__name__
        self._outcome = Outcome(state, error, self._outcome.started, self._clock())

    def outcome(self) -> Outcome:
        return self._outcome

    def join(self, timeout: float | None = None) -> None:
        """For tests and shutdown only: the control loop never waits."""
        self._thread.join(timeout)
