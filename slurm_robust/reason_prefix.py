"""The prefix of every drain reason slurm_robust writes, and of the pending-deep-check one.

A module that imports nothing: slurmd's HealthCheckProgram matches its node's reason
against ``PENDING_PREFIX`` on every node every interval, and importing the health package
for these strings doubled the CPU of each of those runs (slurm_robust/health_check_program.py).
"""

PREFIX = "slurm_robust:"
#: The kind word of a node a job blamed: the deep check returns it when it passes.
PENDING = "pending deep check"
#: The exact start of every "pending deep check" reason (the deep-check side matches it).
PENDING_PREFIX = f"{PREFIX} {PENDING}:"
