"""Where the rehearsal tooling is: a second distribution, ``slurm_robust_rehearsal``.

The embedded mini-cluster, fault injection, the benchmarks, synthetic data and the
example workloads live in rehearsal/ of the checkout, installed next to the library
(``make setup``). The library never imports them; the CLI's ``cluster``, ``bench`` and
``inject`` subcommands and ``python -m slurm_robust.ckpt.gpu_check`` reach them by name,
and where they are not installed say so in one line (:data:`REHEARSAL_MISSING`).
"""

from __future__ import annotations

import importlib.util

#: The rehearsal tooling's distribution and top-level package.
REHEARSAL = "slurm_robust_rehearsal"
#: What a subcommand of the rehearsal tooling says where it is not installed.
REHEARSAL_MISSING = (f"needs the rehearsal tooling ({REHEARSAL}), which is not installed: "
                     "pip install -e rehearsal/ in the slurm_robust checkout "
                     "(`make setup` installs it)")


class RehearsalMissingError(ImportError):
    """The rehearsal distribution is not installed (its message says how to install it)."""


def rehearsal_installed() -> bool:
    """Whether the rehearsal package can be imported here (found, not imported)."""
    try:
        return importlib.util.find_spec(REHEARSAL) is not None
    except (ImportError, ValueError):  # blocked, or a None left in sys.modules
        return False


def require_rehearsal() -> None:
    """Raise :class:`RehearsalMissingError` where the rehearsal tooling is not installed
    (a CLI module of its subcommands calls it when imported, so that the subcommand is
    listed as unavailable with the way to install it)."""
    if not rehearsal_installed():
        raise RehearsalMissingError(REHEARSAL_MISSING)
