"""Workspaces (seed 003): desired state from the hub, actual state from agentk, reconciled in a loop.

Layout as every module: the pure rules both halves share sit at the top (``states``, ``actual_state``,
``params``, ``rules``, ``devfile``, ``desired_config``); the hub's persistence and API use them from
``tether.hub``; ``agent/`` is the agentk half.
"""

#: The module name on the wire (``HeaderExtra.module_name``, the hub path segment).
MODULE_NAME = "remote_development"
#: Label every workspace object carries, selecting what one agent manages (reference §4.2, §5.3).
AGENT_ID_LABEL = "agent.gitlab.com/id"
WORKSPACE_ID_LABEL = "workspaces.gitlab.com/id"
