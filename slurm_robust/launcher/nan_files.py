"""Where the NaN ladder's files live in a run directory, shared by both ends.

The controller writes some of them (``skip.json``: steps the ``skip`` policy drops;
``bitwise.json``: a request that every rank of one attempt run the bitwise reference test)
and the rehearsal tools others (``poison.json``, ``sdc.json``); the workers read them all
(node/nan_local.py). A leaf, so that neither plane imports the other for a file name.
"""

from __future__ import annotations

from pathlib import Path

NAN_DIR = "nan"
SKIP_FILE = "skip.json"
POISON_FILE = "poison.json"
SDC_FILE = "sdc.json"
BITWISE_FILE = "bitwise.json"
NAN_FILES_VERSION = 1


def nan_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / NAN_DIR
