"""The agentk module API (upstream ``modagent``): what an agent module receives and what it must provide.

Adding a module: write ``modules/<name>/agent.py`` with a factory whose ``new(api)`` registers the module's
services on ``api.internal_server`` (kas reaches them through the tunnels) and returns a
:class:`~tether.modshared.module.Module`, then add one line to ``tether.agentk.modules.AGENT_MODULES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from grpc import aio

from tether.kube.client import KubeClient
from tether.kube.kubeconfig import KubeCredentials
from tether.modagent.gitlab_request import GitlabRequestError, GitlabResponse, make_gitlab_request
from tether.modagent.internal_server import InternalServer
from tether.modshared.module import Module, Spawner
from tether.pb.gitlab.agent.agentcfg import agentcfg_pb2
from tether.tool.grpc_meta import Metadata

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
        kas: channel to kas' agent listener, for modules that call kas themselves (upstream ``KasConn``);
            None in processes without kas (tests of single modules).
        kas_metadata: per-RPC metadata of every call to kas (``authorization: Bearer <token>`` and the
            ``--kas-header`` pairs, and the connection id).
        connection_id: this agentk's connection id, the random pod id it registers with (kas.md §3.3); 0 when
            the process has none (tests of single modules).
        configuration_callbacks: filled by :meth:`on_configuration`.
        stream_end_callbacks: filled by :meth:`on_configuration_stream_end`.
    """

    kube: KubeClient
    kube_credentials: KubeCredentials
    internal_server: InternalServer
    spawn: Spawner
    kas: aio.Channel | None = None
    kas_metadata: Metadata = ()
    connection_id: int = 0
    configuration_callbacks: list[ConfigurationCallback] = field(default_factory=list)
    stream_end_callbacks: list[Callable[[], None]] = field(default_factory=list)
    #: Where agentk runs (``POD_NAMESPACE``/``POD_NAME``); set by the process before any configuration arrives.
    pod_namespace: str = "default"
    pod_name: str = ""

    async def make_gitlab_request(
        self, module_name: str, path: str, *, method: str = "GET", body: bytes = b"", timeout_s: float = 60.0
    ) -> GitlabResponse:
        """An HTTP request to the hub's ``/api/v4/internal/kubernetes/modules/<module_name><path>`` through kas.

        Upstream ``modagent.Api.MakeGitLabRequest``; the hub's status and body come back unchanged.

        Raises:
            GitlabRequestError: not connected to kas yet, kas refused, or the hub is unreachable
                (``retryable`` says whether trying again later may work).
        """
        if self.kas is None:
            raise GitlabRequestError("not connected to kas yet", retryable=True)
        return await make_gitlab_request(
            self.kas, self.kas_metadata, module_name, path, method=method, body=body, timeout_s=timeout_s
        )

    def on_configuration_stream_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever agentk's configuration stream ended (it reconnects, maybe to another kas)."""
        self.stream_end_callbacks.append(callback)

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

        agentk puts such modules behind :class:`tether.modagent.leader.LeaderOnlyModules` (one Lease
        ``agent-<id>-lock`` per agent): they start when this replica leads and stop when it loses the Lease.
        """

    def new(self, api: AgentApi) -> Module | None:
        """Register the module's services on ``api.internal_server`` and return it, or None when not wanted.

        Raises:
            Exception: the module cannot be built; agentk does not start.
        """
