"""The agentk module API (upstream ``modagent``): what an agent module receives and what it must provide.

Adding a module: write ``modules/<name>/agent.py`` with a factory whose ``new(api)`` registers the module's
services on ``api.internal_server`` (kas reaches them through the tunnels) and returns a
:class:`~tether.modshared.module.Module`, then add one line to ``tether.agentk.modules.AGENT_MODULES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tether.kube.client import KubeClient
from tether.kube.kubeconfig import KubeCredentials
from tether.modagent.internal_server import InternalServer
from tether.modshared.module import Module, Spawner
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2

ConfigurationCallback = Callable[[agentcfg_pb2.AgentConfiguration], None]


@dataclass
class AgentApi:
    """Everything an agentk module may use (upstream ``modagent.Config``).

    Attributes:
        kube: API client with agentk's credentials (the field manager for server-side apply is ``agentk``).
        kube_credentials: the same credentials, for modules that open their own connections.
        internal_server: the internal gRPC server; register services before it starts (kas calls them
            through the reverse tunnels).
        spawn: starts a supervised background loop.
        configuration_callbacks: filled by :meth:`on_configuration`.
    """

    kube: KubeClient
    kube_credentials: KubeCredentials
    internal_server: InternalServer
    spawn: Spawner
    configuration_callbacks: list[ConfigurationCallback] = field(default_factory=list)

    def on_configuration(self, callback: ConfigurationCallback) -> None:
        """Call ``callback`` with each new agent configuration kas sends (kas.md §6.3 "Apply").

        The callback runs on the event loop and must not block; it starts work with :attr:`spawn`.
        """
        self.configuration_callbacks.append(callback)


class AgentModuleFactory(Protocol):
    """Builds one agentk module (upstream ``modagent.Factory``)."""

    @property
    def name(self) -> str:
        """The module's name."""

    @property
    def leader_only(self) -> bool:
        """Upstream's ``IsProducingLeaderModules``: run only on the elected leader among agentk replicas.

        agentk has no leader election yet, so every replica runs these too; the flag records the intent
        for the module that needs it (remote_development).
        """

    def new(self, api: AgentApi) -> Module | None:
        """Register the module's services on ``api.internal_server`` and return it, or None when not wanted.

        Raises:
            Exception: the module cannot be built; agentk does not start.
        """
