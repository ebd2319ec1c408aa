"""Signals the agent sends its workers, shared by the agent (node plane) and the
training-side API (``slurm_robust.train``), which installs their handlers.

``DRAIN_SIGNAL`` ends a worker whose generation stops by choice (a hot update applied
at a step boundary), not by a failure: its handler waits for the snapshots already
taken to reach their tiers, then ends the worker as SIGTERM would. Without it the
restart could find the boundary step's snapshot half written and redo that step.
SIGURG is used because its default action is to ignore it: a worker that does not use
``slurm_robust.train`` (a plain script) is never killed by it, and the agent sends it
only to a worker whose /proc status shows a handler for it. A failure's stop does not
drain: the survivors wait inside a collective, where no Python handler runs, and the
drain's wait would only delay the restart.
"""

from __future__ import annotations

import signal

DRAIN_SIGNAL = signal.SIGURG
#: How long the agent waits for draining workers before SIGTERM (the worker's own
#: flush gives up a second earlier, so its exit, not the agent's deadline, ends it).
DRAIN_S = 3.0
DRAIN_FLUSH_S = DRAIN_S - 1.0

#: Slurm's warning before the time limit (``sbatch --signal=28@S``, set by ``submit``):
#: the agent notes it and the controller requeues the job with its newest step. SIGWINCH
#: because its default action is to ignore it. Slurm sends it to every process of the job
#: step (the workers too), and a requeued job's new allocation may get it again at launch,
#: before any handler is installed (seen on Slurm 22.05: the previous allocation's end
#: time is still the reference); SIGUSR2, submitit's choice, ends such a process (and the
#: workers' stack dumps use it), SIGURG is the drain signal above.
WARNING_SIGNAL = signal.SIGWINCH
