"""Run ``script.py args`` or ``-m module args`` in this interpreter as ``__main__``.

A leaf shared by the fork server's workers (launcher/node/worker_order.py) and the
auto-steps shim (autosteps.py): both become the user's script exactly as ``python
script.py args`` would (sys.argv, sys.path[0], exit status, tracebacks).
"""

from __future__ import annotations

import os
import runpy
import sys


def run_as_main(argv: list[str]) -> None:
    """``argv`` is the command without the interpreter; returns when the script does."""
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
