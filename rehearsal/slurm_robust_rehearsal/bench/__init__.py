"""Benchmarks behind ``slurm-robust bench NAME``: one module per benchmark exposing
``HELP``, ``add_arguments(parser)`` and ``run(args) -> dict`` (printed as JSON)."""
