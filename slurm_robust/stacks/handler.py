"""The faulthandler fallback, installed inside the training processes.

Where ptrace is refused (no ``SYS_PTRACE`` in a container, Yama ptrace_scope), py-spy
cannot read a process; the process can still print its own Python stacks. The training
API calls :func:`install_stack_dump_handler` early; a capture then sends the signal
(SIGUSR2 by default) and reads what the process appended to its file.

faulthandler writes from the C signal handler, so it works while the main thread is
blocked inside a C call (a gloo wait, a lock). Forked children (data-loader workers)
inherit the handler; an at-fork hook re-installs it there with the child's own file,
so parent and child never write into the same file.

Only the standard library is imported here: this runs in every training process.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
from pathlib import Path
from typing import IO

DEFAULT_SIGNAL = signal.SIGUSR2
# Relative to the run directory; {node} and {pid} name one process uniquely across
# hosts (pids repeat between machines).
DEFAULT_TEMPLATE = "stacks/faulthandler/{node}-{pid}.txt"

_state: dict[str, object] = {}


def node_name() -> str:
    """The Slurm node name of this process (SLURMD_NODENAME), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def handler_path(template: str, pid: int, node: str) -> Path:
    """The file a process with ``pid`` on ``node`` writes its stacks to."""
    return Path(template.format(pid=pid, node=node))


def install_stack_dump_handler(path_template: str,
                               sig: int = DEFAULT_SIGNAL) -> Path:
    """Make ``sig`` append all threads' Python stacks to a per-process file.

    Parameters
    ----------
    path_template:
        A path with ``{pid}`` and optionally ``{node}``, e.g.
        ``f"{run_dir}/{DEFAULT_TEMPLATE}"``. The capture side formats the same
        template to find the file.
    sig:
        The signal to register (default SIGUSR2).

    Returns the path of this process's file. Calling it again replaces the handler.
    Raises ValueError when the template lacks ``{pid}``.
    """
    if "{pid}" not in path_template:
        raise ValueError(f"stack dump path template {path_template!r} must contain "
                         "'{pid}' so that each process writes its own file")
    path = handler_path(path_template, os.getpid(), node_name())
    path.parent.mkdir(parents=True, exist_ok=True)
    old = _state.get("file")
    # Unbuffered append: faulthandler writes with write(2) on the descriptor.
    fh: IO[bytes] = open(path, "ab", buffering=0)  # noqa: SIM115 - kept open on purpose
    faulthandler.register(sig, file=fh, all_threads=True, chain=False)
    _state.update(file=fh, template=path_template, sig=sig, path=path)
    if old is not None and hasattr(old, "close"):
        old.close()
    if not _state.get("at_fork"):
        os.register_at_fork(after_in_child=_reinstall_in_child)
        _state["at_fork"] = True
    return path


def uninstall_stack_dump_handler() -> None:
    """Remove the handler (the signal gets its default action back) and close the file."""
    sig = _state.pop("sig", None)
    if isinstance(sig, int):
        faulthandler.unregister(sig)
    fh = _state.pop("file", None)
    if fh is not None and hasattr(fh, "close"):
        fh.close()
    _state.pop("template", None)
    _state.pop("path", None)


def _reinstall_in_child() -> None:
    template, sig = _state.get("template"), _state.get("sig")
    if isinstance(template, str) and isinstance(sig, int):
        install_stack_dump_handler(template, sig)
