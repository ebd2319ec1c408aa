"""Node plane: what runs on every node of the allocation (agent, workers, fork server)."""
