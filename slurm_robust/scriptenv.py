"""What an unmodified training script needs from the launcher, outside the workers' env.

- :func:`worker_command`: the command one worker generation runs. From the first
  restart on (attempt > 0) it appends ``--resume-args`` when ``--resume-if-exists``
  names a file that exists (relative to the run's working directory) or when no such
  file is named; with ``--auto-steps`` the script runs under ``python -m
  slurm_robust.autosteps`` (an optimizer step hook that reports steps, see autosteps.py).
- :func:`interpreter_warning`: the worker command's Python cannot import torch, or is
  not the launcher's interpreter (the fork server and ``--auto-steps`` then need
  slurm_robust importable in that interpreter as well).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

AUTOSTEPS_MODULE = "slurm_robust.autosteps"


def is_python(arg0: str) -> bool:
    """Whether a command's first word is a Python interpreter (python, python3.11, ...)."""
    name = os.path.basename(arg0)
    return name.startswith("python") and not name.endswith((".py", "-config"))


def worker_command(command: Sequence[str], attempt: int, resume_args: Sequence[str] = (),
                   resume_if_exists: str | None = None, auto_steps: bool = False,
                   cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """The argv of the workers of one attempt (see the module docstring)."""
    argv = list(command)
    if auto_steps and len(argv) > 1 and is_python(argv[0]):
        argv = [argv[0], "-m", AUTOSTEPS_MODULE, *argv[1:]]
    if attempt > 0 and resume_args:
        marker = Path(cwd or os.getcwd()) / resume_if_exists if resume_if_exists else None
        if marker is None or marker.exists():
            argv += list(resume_args)
    return argv


def interpreter_warning(command: Sequence[str], executable: str = sys.executable,
                        timeout_s: float = 20.0) -> str | None:
    """A one-line warning about the command's interpreter, or None when it looks right.

    Only commands that start with a Python interpreter are checked; ``find_spec`` is
    used, so torch is located, not imported (a fraction of a second).
    """
    if not command or not is_python(command[0]):
        return None
    found = shutil.which(command[0])
    if found is None:
        return f"the worker command's interpreter {command[0]!r} is not on PATH here"
    same = os.path.realpath(found) == os.path.realpath(executable)
    if not same:
        probe = [found, "-c", "import importlib.util, sys; "
                 "sys.exit(importlib.util.find_spec('torch') is None)"]
        try:
            code = subprocess.run(probe, capture_output=True, timeout=timeout_s).returncode
        except (OSError, subprocess.TimeoutExpired):
            code = 1
        if code != 0:
            return (f"the worker command's interpreter {found} cannot import torch; use "
                    f"the launcher's one ({executable}) or a venv that has torch")
        return (f"the worker command's interpreter {found} is not the launcher's "
                f"({executable}): workers are started without the pre-loaded interpreter, "
                "and slurm_robust must be importable there for the training API or "
                "--auto-steps")
    return None
