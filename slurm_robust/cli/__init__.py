"""The ``slurm-robust`` command line: one console script, one module per subcommand."""
