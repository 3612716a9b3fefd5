"""Feature modules: each owns its kas half, its agentk half and its protocol, side by side."""
