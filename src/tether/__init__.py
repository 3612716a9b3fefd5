"""Tether: an agent system for Kubernetes (kas, agentk and the hub), wire-compatible with GitLab's agent."""

__version__ = "0.1.0"
