"""agentk half of ``kubernetes_api``: ``MakeRequest`` calls to the API server with agentk's credentials."""

from __future__ import annotations

from tether.modagent.api import AgentApi
from tether.modules.kubernetes_api.agent.forward import SERVICE, KubernetesApiAgent


class KubernetesApiAgentModule:
    """Owns the API server connections that ``MakeRequest`` opens; closes them on stop.

    Args:
        agent: the registered ``MakeRequest`` handler.
    """

    name = "kubernetes_api"

    def __init__(self, agent: KubernetesApiAgent) -> None:
        self._agent = agent

    async def start(self) -> None:
        """Nothing to start: the handler runs on the internal server."""

    async def stop(self) -> None:
        """Close the API server connections."""
        await self._agent.close()


class KubernetesApiAgentFactory:
    """Registers ``KubernetesApi/MakeRequest`` on the internal server."""

    name = "kubernetes_api"
    leader_only = False

    def new(self, api: AgentApi) -> KubernetesApiAgentModule:
        """Register the handler and return the module that closes its connections."""
        agent = KubernetesApiAgent(api.kube_credentials)
        api.internal_server.add_generic_handler(SERVICE, agent.handlers())
        return KubernetesApiAgentModule(agent)
