"""Pre-started worker processes: the interpreter and torch are loaded before a restart.

Importing torch takes seconds (2-5 s on a loaded 2-core node), and a script's first
optimizer imports torch._dynamo (another 0.8-2 s): together most of an in-place restart.
So each agent keeps one *zygote* per local rank: ``python -m
slurm_robust.launcher.node.zygote torch torch._dynamo`` imports the listed modules (the
config's ``prewarm``), then blocks reading one
JSON line on stdin: ``{"argv": [...], "env": {...}, "cwd": ..., "log": ...}``. On that
line it points its stdout and stderr at the log, replaces its environment, and runs the
script (``script.py args`` or ``-m module args``) as ``__main__``, exactly as
``python script.py args`` would (sys.argv, sys.path[0], exit status, tracebacks).

Used only when the worker command starts with this agent's own interpreter (the same
path as ``sys.executable``) and a Python script or module; anything else is started
with a plain exec. Note: /proc/<pid>/environ of a zygote worker shows the agent's
environment (the one it was started with), not the rank's; the job id is in both.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from slurm_robust.run_main import run_as_main


def usable(command: list[str] | tuple[str, ...], executable: str = sys.executable) -> bool:
    """Whether ``command`` can run in a zygote of ``executable``."""
    if len(command) < 2 or os.path.abspath(command[0]) != os.path.abspath(executable):
        return False
    first = command[1]
    return (first == "-m" and len(command) > 2) or (first.endswith(".py") and
                                                      not first.startswith("-"))


def argv_for(command: list[str] | tuple[str, ...], preload: tuple[str, ...]) -> list[str]:
    return [command[0], "-m", "slurm_robust.launcher.node.zygote", *preload]


def main() -> None:
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # the worker will import it (and fail) itself if it needs it
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)  # the agent closed us without work (shutdown)
    order = json.loads(line)
    fd = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.environ.clear()
    os.environ.update(order["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
        # OpenMP read OMP_NUM_THREADS when torch was pre-imported, with the agent's
        # environment: apply the rank's value now, as a fresh interpreter would.
        sys.modules["torch"].set_num_threads(int(threads))
    os.chdir(order["cwd"])
    run_as_main(list(order["argv"]))


if __name__ == "__main__":
    main()
