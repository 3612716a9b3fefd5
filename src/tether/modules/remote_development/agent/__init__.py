"""agentk half of ``remote_development``: the leader-only reconcile loop (reference §5)."""
