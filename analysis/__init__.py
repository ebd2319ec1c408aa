"""Incident analysis and post-mortem reports (pandas).

Inputs (docs/SCHEMAS.md): run event logs and verdicts (``loaders``), node health journals,
and Slurm's own records: sacct, ``sacctmgr show event``, ``sinfo -R`` (``slurm_text``
parses recorded output, ``fetch`` asks Slurm through ``slurm_robust.slurm``).
Metrics: ``ettr`` (cumulative and sliding-window ETTR), ``incidents`` (timings, losses,
by class and resolution), ``nodes`` (blame, drains, repeat offenders), ``fleet`` (sacct
failures, node-hours lost, failure rate, reserve size). ``pipeline.analyse`` runs them
all; ``report.write_report`` writes report.md/report.html with ``plots``. Synthetic
traces with exact ground truth and the scale benchmark are rehearsal tooling
(``slurm_robust_rehearsal.synth``, ``slurm_robust_rehearsal.bench.analysis``).

The package itself imports nothing heavy: names below load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> module. Loaded on first use (PEP 562) so that importing a light module
# of this package (``taxonomy``, for ``slurm-robust --help``) does not pull in pandas.
_EXPORTS = {
    "LoadIssues": "frames", "RunLog": "loaders", "load_health": "loaders",
    "load_run_dirs": "loaders", "load_verdicts": "loaders", "Analysis": "pipeline",
    "Inputs": "pipeline", "analyse": "pipeline", "load_inputs": "pipeline",
    "write_report": "report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
