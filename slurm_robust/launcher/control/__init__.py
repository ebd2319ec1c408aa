"""Control plane: the controller (in agent 1, or agent 0 when alone), the recovery owner,
the pure policy, fail-slow, the Slurm side of recovery, the persisted run state and the
event log."""
