"""Workspaces (seed 003): desired state from the hub, actual state from agentk, reconciled in a loop.

Layout as every module, each half named by the process it runs in: ``hub/`` holds the rules GitLab's Rails
half applies (devfile, desired config, lifecycle rules, reconcile params, actual state, agent settings), used
by the hub's persistence and API in ``tether.hub.workspaces``; ``agent/`` is the agentk half; ``client/`` the
``tether workspace`` command. What both halves share sits at the top: ``states``, and ``protocol`` (the typed
reconcile messages and the words on the wire).
"""

#: The module name on the wire (``HeaderExtra.module_name``, the hub path segment).
MODULE_NAME = "remote_development"
#: Label every workspace object carries, selecting what one agent manages (reference §4.2, §5.3).
AGENT_ID_LABEL = "agent.gitlab.com/id"
WORKSPACE_ID_LABEL = "workspaces.gitlab.com/id"
