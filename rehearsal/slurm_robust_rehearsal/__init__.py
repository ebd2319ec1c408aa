"""Rehearsal tooling of slurm_robust: the embedded mini-cluster (``cluster``), fault
injection (``inject``), benchmarks (``bench``), synthetic data (``synth``) and the example
workloads (``workloads``).

A distribution of its own (rehearsal/setup.cfg), installed next to the library by
``make setup``. Nothing a production node runs (prolog, epilog, agents, controller,
workers) imports it, and the library never does: the ``slurm-robust`` CLI reaches its
``cluster``, ``bench`` and ``inject`` subcommands by name. It exists for rehearsals on the
mini-cluster, for the benchmarks that print JSON, and for the tests.
"""
