"""Run one Slurm command: argv list, timeout, retries on transient failures.

Every Slurm CLI call in the project goes through :func:`run_slurm_command`; nothing
builds a command line through a shell.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slurm_robust.errors import SlurmRobustError

log = logging.getLogger("slurm_robust.slurm")

# What slurmctld/slurmdbd say when they are busy or restarting; worth a retry.
TRANSIENT_MARKERS = (
    "socket timed out",
    "slurm_receive_msg",
    "unable to contact slurm controller",
    "connection refused",
    "slurmctld is busy",
    "resource temporarily unavailable",
    "try again",
    "communication connection failure",
    "zero bytes were transmitted",
    "slurm backup controller in standby mode",
    "error connecting to slurm",
)


class SlurmCommandError(SlurmRobustError):
    """A Slurm command failed; the message names the command and what Slurm said."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str,
                 attempts: int = 1, timed_out: bool = False) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.attempts = attempts
        self.timed_out = timed_out
        cmd = " ".join(self.argv)
        if timed_out:
            what = "timed out"
        else:
            what = f"exited {returncode}"
        said = self.stderr.splitlines()[-1] if self.stderr else "(nothing on stderr)"
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"`{cmd}` {what}{tries}: {said}")


class SlurmNotInstalledError(SlurmRobustError):
    """A Slurm command is not on PATH."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a command is retried: attempts in all, first delay, backoff factor."""

    attempts: int = 4
    delay_s: float = 0.5
    backoff: float = 2.0
    timeout_s: float = 30.0


DEFAULT_POLICY = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)


def is_transient(stderr: str) -> bool:
    """True when stderr looks like a busy or briefly unreachable controller."""
    low = stderr.lower()
    return any(marker in low for marker in TRANSIENT_MARKERS)


def run_slurm_command(argv: Sequence[str], *, policy: RetryPolicy = DEFAULT_POLICY,
                      env: Mapping[str, str] | None = None, input_text: str | None = None,
                      check: bool = True,
                      sleep: Callable[[float], None] = time.sleep,
                      ) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command and return its completed process.

    Retries when the command times out or fails with a transient message, with
    exponential backoff. Raises SlurmCommandError when it still fails (and ``check``),
    SlurmNotInstalledError when the program is missing.
    """
    argv = [str(a) for a in argv]
    delay = policy.delay_s
    last: SlurmCommandError | None = None
    for attempt in range(1, policy.attempts + 1):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=_env(env),
                                  timeout=policy.timeout_s, input=input_text,
                                  stdin=None if input_text is not None else subprocess.DEVNULL)
        except FileNotFoundError as exc:
            raise SlurmNotInstalledError(
                f"{argv[0]} not found on PATH: install Slurm's client commands "
                f"(Debian: slurm-client) or run `slurm-robust cluster up`") from exc
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            last = SlurmCommandError(argv, None, stderr or f"no answer in {policy.timeout_s:g} s",
                                     attempt, timed_out=True)
        else:
            if proc.returncode == 0 or not check:
                return proc
            last = SlurmCommandError(argv, proc.returncode, proc.stderr or proc.stdout, attempt)
            if not is_transient(proc.stderr):
                raise last
        if attempt < policy.attempts:
            log.info("retrying %s in %.1f s: %s", argv[0], delay, last)
            sleep(delay)
            delay *= policy.backoff
    assert last is not None
    raise last


def _env(extra: Mapping[str, str] | None) -> dict[str, str] | None:
    if not extra:
        return None
    env = dict(os.environ)
    env.update(extra)
    return env
