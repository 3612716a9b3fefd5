"""agentk half of ``workspace_access``: ``WorkspaceAccess.MakeRequest`` to workspace Services."""

from __future__ import annotations

from tether.modagent.api import AgentApi
from tether.modules.workspace_access import MODULE_NAME
from tether.modules.workspace_access.agent.endpoints import EndpointResolver
from tether.modules.workspace_access.agent.forward import SERVICE, WorkspaceAccessAgent
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2

__all__ = ["WorkspaceAccessAgentFactory", "WorkspaceAccessAgentModule"]


class WorkspaceAccessAgentModule:
    """Owns the workspace connections ``MakeRequest`` opens; closes them on stop.

    Args:
        agent: the registered handler.
    """

    name = MODULE_NAME

    def __init__(self, agent: WorkspaceAccessAgent) -> None:
        self._agent = agent

    async def start(self) -> None:
        """Nothing to start: the handler runs on the internal server."""

    async def stop(self) -> None:
        """Close the workspace connections."""
        await self._agent.close()


class WorkspaceAccessAgentFactory:
    """Registers ``WorkspaceAccess/MakeRequest`` on the internal server (every replica serves it)."""

    name = MODULE_NAME
    leader_only = False

    def new(self, api: AgentApi) -> WorkspaceAccessAgentModule:
        """Register the handler; the agent id comes with each configuration (Services are checked against it)."""
        agent = WorkspaceAccessAgent(EndpointResolver(api.kube))

        def learn_agent_id(configuration: agentcfg_pb2.AgentConfiguration) -> None:
            agent.agent_id = configuration.agent_id

        api.on_configuration(learn_agent_id)
        api.internal_server.add_generic_handler(SERVICE, agent.handlers())
        return WorkspaceAccessAgentModule(agent)
