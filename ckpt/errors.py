"""Exceptions of the checkpoint package; each message names the facts and a next step."""

from slurm_robust.errors import SlurmRobustError


class CheckpointError(SlurmRobustError):
    """A checkpoint could not be written or read as configured."""


class NoValidCheckpointError(CheckpointError):
    """Copies exist, but no step is complete and valid for every rank."""


class PeerBackupError(CheckpointError):
    """The peer backup cannot be placed or a transfer failed."""
