"""agentk half of ``graph``: ``KubernetesApi/WatchGraph`` on the internal server, served by the graph engine."""

from __future__ import annotations

from tether.modagent.api import AgentApi
from tether.modshared.module import IdleModule, Module
from tether.modules.graph.agent.servicer import GraphServicer


class GraphAgentFactory:
    """Registers ``WatchGraph`` (the Graph API, docs/graph.md) on the internal server."""

    name = "graph"
    leader_only = False

    def new(self, api: AgentApi) -> Module:
        """Register ``WatchGraph``."""
        GraphServicer(api.kube).register(api.internal_server)
        return IdleModule(self.name)
