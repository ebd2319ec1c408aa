"""slurm_robust: ByteRobust-style fault tolerance for training jobs on Slurm.

Feature packages:

- ``slurm_robust.slurm``: the one place that talks to Slurm (typed records, timeouts, retries).
- ``slurm_robust.health``: node self-checks, the health journal, fault injection.
- ``slurm_robust.reserve``: the warm reserve partition, its sizing and the verdict handoff.
- ``slurm_robust.launcher``: the submitit wrapper, per-node agents and the recovery ladder.
- ``slurm_robust.stacks``: stack capture, aggregation and fail-slow voting.
- ``slurm_robust.ckpt``: per-step in-memory checkpoints with peer backup and disk tiers.
- ``slurm_robust.analysis``: incident analysis and post-mortem reports.

Heavy imports (torch, pandas) stay inside the packages that need them, so the node
prolog, which imports ``slurm_robust.health``, starts fast. The rehearsal tooling (the
embedded mini-cluster, fault injection, benchmarks) is a distribution of its own,
``slurm_robust_rehearsal`` (rehearsal/ in the checkout), which this package never imports.
"""

__version__ = "0.1.0"
