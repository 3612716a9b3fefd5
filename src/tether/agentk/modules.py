"""The modules agentk runs, in start order (stop runs in reverse). Adding a module is one line here."""

from __future__ import annotations

from tether.modagent.api import AgentModuleFactory
from tether.modules.agent_registrar.agent import AgentRegistrarAgentFactory
from tether.modules.graph.agent import GraphAgentFactory
from tether.modules.kubernetes_api.agent import KubernetesApiAgentFactory
from tether.modules.pods.agent import PodsAgentFactory
from tether.modules.remote_development.agent.worker import RemoteDevelopmentAgentFactory
from tether.modules.workspace_access.agent import WorkspaceAccessAgentFactory

AGENT_MODULES: list[AgentModuleFactory] = [
    PodsAgentFactory(),
    KubernetesApiAgentFactory(),
    GraphAgentFactory(),
    RemoteDevelopmentAgentFactory(),
    WorkspaceAccessAgentFactory(),
    AgentRegistrarAgentFactory(),
]
