"""The root of every exception slurm_robust raises on purpose.

The CLI turns a :class:`SlurmRobustError` into one line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""


class SlurmRobustError(Exception):
    """An error with a message a user can act on."""

    exit_code = 1


class UsageError(SlurmRobustError):
    """Bad input from the user: a value out of range, a missing file, a bad option."""

    exit_code = 2
