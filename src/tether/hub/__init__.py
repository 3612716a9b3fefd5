"""The hub: the control plane (users, projects, agents, configuration) and its clients of kas."""
