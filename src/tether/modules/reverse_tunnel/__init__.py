"""Reverse tunnels: kas registry and Connect handler, agentk tunnel pool."""
