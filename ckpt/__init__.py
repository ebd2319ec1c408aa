"""Per-step checkpoints: in node shared memory, a peer backup, async disk tiers."""
