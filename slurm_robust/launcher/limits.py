"""Process limits the agent and the controller raise for themselves at start."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("slurm_robust.launcher.limits")


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit and return (soft, hard).

    The agent holds its workers' pipes and pidfds, and the agent that hosts the
    controller one socket per agent (plus strangers until they are cut off); the
    common soft default of 1024 is reached long before the hard limit. Never lowers a
    limit; a refusal is logged and the limits stay as they were."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or soft == resource.RLIM_INFINITY:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # an unlimited hard limit is above nr_open
        log.warning("could not raise the open-file limit from %s to %s: %s", soft, hard, exc)
        return soft, hard
    return hard, hard
