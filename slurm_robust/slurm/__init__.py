"""The one place that talks to Slurm.

Use :class:`Slurm` (``client.py``) for everything: typed records (:class:`Node`,
:class:`Job`, :class:`AcctJob`), a timeout on every call, retries of transient
failures, and :class:`SlurmCommandError` naming the command and what Slurm said.
Parsers in ``records.py`` are pure functions over Slurm's output strings.
"""

from slurm_robust.slurm.client import (
    Slurm,
    check_job_id,
    check_node_name,
    clean_reason,
    pyslurm_status,
)
from slurm_robust.slurm.hostlist import compress_hostlist, expand_hostlist
from slurm_robust.slurm.records import AcctJob, Job, Node, SlurmParseError
from slurm_robust.slurm.runner import (
    RetryPolicy,
    SlurmCommandError,
    SlurmNotInstalledError,
    run_slurm_command,
)

__all__ = [
    "AcctJob", "Job", "Node", "RetryPolicy", "Slurm", "SlurmCommandError",
    "SlurmNotInstalledError", "SlurmParseError", "check_job_id", "check_node_name",
    "clean_reason", "compress_hostlist", "expand_hostlist", "pyslurm_status",
    "run_slurm_command",
]
