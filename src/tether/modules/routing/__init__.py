"""Routing kas -> gateway kas -> agentk over the private API (seed 001)."""
