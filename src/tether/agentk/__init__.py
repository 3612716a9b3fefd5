"""agentk: the in-cluster agent (kas connection, internal server, module wiring)."""
