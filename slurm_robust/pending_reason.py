"""The prefix of every drain reason slurm_robust writes, the pending-deep-check one, and
the test for a node that waits for its deep check.

A module that imports nothing: slurmd's HealthCheckProgram runs this test on every node
every interval, and importing the health package for it doubled the CPU of each of those
runs (slurm_robust/health_check_program.py).
"""

PREFIX = "slurm_robust:"
#: The kind word of a node a job blamed: the deep check returns it when it passes.
PENDING = "pending deep check"
#: The exact start of every "pending deep check" reason (the deep-check side matches it).
PENDING_PREFIX = f"{PREFIX} {PENDING}:"


def is_pending(state: str, reason: str) -> bool:
    """Drained with our pending reason and no job left on it (``draining`` nodes still
    run jobs: a deep suite beside a job would disturb it and judge the node under load)."""
    return state == "drained" and reason.startswith(PENDING_PREFIX)
