"""kas: the agent server (listeners, configuration, module wiring, shutdown)."""
