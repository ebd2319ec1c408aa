"""Submission plane: what runs on the login node or in the batch script (executor,
``slurm-robust launch``, CLI options, ``slurm-robust status``)."""
