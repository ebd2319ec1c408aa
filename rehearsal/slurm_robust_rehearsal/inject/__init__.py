"""Fault injection for tests and rehearsals, behind ``slurm-robust inject``.

``probes``/``probes_cli`` write a node's injected probe values (the read side, which the
real check path goes through, is :mod:`slurm_robust.health.probes`); ``job``/``job_cli``
put real faults (signals, a node kill) into a running robust job.
"""
