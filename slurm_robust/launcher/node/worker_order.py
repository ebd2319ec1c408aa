"""Run one worker in an interpreter that has already imported torch.

Importing torch takes seconds (2-5 s on a loaded 2-core node), and a script's first
optimizer imports torch._dynamo (another 0.8-2 s): together most of an in-place restart.
So each agent keeps a fork server (forkserver.py) that has imported the config's
``prewarm`` modules once; every worker is a fork of it, and this module turns that fork
into the worker: given a :class:`WorkerOrder` (argv, env, cwd, log) it points stdout and
stderr at the log, replaces the environment, and runs the script (``script.py args`` or
``-m module args``) as ``__main__``, exactly as ``python script.py args`` would
(sys.argv, sys.path[0], exit status, tracebacks).

Used only when the worker command starts with this agent's own interpreter (the same
path as ``sys.executable``) and a Python script or module; anything else is started
with a plain exec. Note: /proc/<pid>/cmdline and /proc/<pid>/environ of such a worker
show the fork server's (the agent's environment), not the rank's; the job id is in both.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from slurm_robust.run_main import run_as_main


@dataclass(frozen=True)
class WorkerOrder:
    """What a fork needs to become one worker; ``argv`` is the command without the
    interpreter (``script.py args`` or ``-m module args``)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> WorkerOrder:
        argv, env, cwd, log = obj.get("argv"), obj.get("env"), obj.get("cwd"), obj.get("log")
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
                and isinstance(env, dict)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
                and isinstance(cwd, str) and isinstance(log, str)):
            raise ValueError(f"not a worker order: {sorted(obj)}")
        return cls(list(argv), dict(env), cwd, log)


def usable(command: list[str] | tuple[str, ...], executable: str = sys.executable) -> bool:
    """Whether ``command`` can run in a pre-imported interpreter of ``executable``."""
    if len(command) < 2 or os.path.abspath(command[0]) != os.path.abspath(executable):
        return False
    first = command[1]
    return (first == "-m" and len(command) > 2) or (first.endswith(".py") and
                                                      not first.startswith("-"))


def run_order(order: WorkerOrder) -> None:
    """Become the worker ``order`` describes; returns when its script does (the
    interpreter's own exit then gives the status, as for ``python script.py``)."""
    _redirect(order)
    threads = order.env.get("OMP_NUM_THREADS", "")
    os.environ.clear()
    os.environ.update(order.env)
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
        # OpenMP read OMP_NUM_THREADS when torch was pre-imported, with the agent's
        # environment: apply the rank's value now, as a fresh interpreter would.
        sys.modules["torch"].set_num_threads(int(threads))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # Every fork would otherwise share the server's legacy global RNG state; a fresh
        # interpreter seeds it from the OS (Python's own `random` reseeds at fork).
        numpy.random.seed()
    run_as_main(list(order.argv))


def exec_order(order: WorkerOrder) -> None:
    """Become the worker through a fresh interpreter (``exec``): for a fork server whose
    pre-imports initialised CUDA, which a forked child cannot use again."""
    _redirect(order)
    os.execve(sys.executable, [sys.executable, *order.argv], order.env)


def _redirect(order: WorkerOrder) -> None:
    """stdout and stderr to the order's log (0600, no link), stdin from /dev/null, the
    order's working directory."""
    fd = os.open(order.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:
        os.dup2(devnull, 0)
        os.close(devnull)
    os.chdir(order.cwd)
