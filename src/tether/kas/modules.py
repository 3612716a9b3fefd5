"""The modules kas runs, in start order (stop runs in reverse). Adding a module is one line here."""

from __future__ import annotations

from tether.modserver.api import ServerModuleFactory
from tether.modules.agent_configuration.server import AgentConfigurationServerFactory
from tether.modules.agent_registrar.server import AgentRegistrarServerFactory
from tether.modules.agent_tracker.server import AgentTrackerServerFactory
from tether.modules.audit.server import AuditServerFactory
from tether.modules.gitlab_access.server import GitlabAccessServerFactory
from tether.modules.graph.server import GraphServerFactory
from tether.modules.kubernetes_api.server import KubernetesApiServerFactory
from tether.modules.pods.server import PodsServerFactory
from tether.modules.reverse_tunnel.server import ReverseTunnelServerFactory
from tether.modules.workspace_access.server import WorkspaceAccessServerFactory

#: Upstream's order (modules.md): configuration, tracker, tunnels, then the APIs that use them; ``audit`` first
#: (a Tether module): the relays built after it record through its sink, and it stops last.
SERVER_MODULES: list[ServerModuleFactory] = [
    AuditServerFactory(),
    AgentConfigurationServerFactory(),
    GitlabAccessServerFactory(),
    AgentTrackerServerFactory(),
    AgentRegistrarServerFactory(),
    ReverseTunnelServerFactory(),
    PodsServerFactory(),
    GraphServerFactory(),
    KubernetesApiServerFactory(),
    WorkspaceAccessServerFactory(),
]
