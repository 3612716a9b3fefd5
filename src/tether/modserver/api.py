"""The kas module API (upstream ``modserver``): what a server module receives and what it must provide.

Adding a module: write ``modules/<name>/server.py`` with a factory whose ``new(api)`` registers the
module's services and returns a :class:`~tether.modshared.module.Module`, then add one line to
``tether.kas.modules.SERVER_MODULES`` (docs/architecture.md, "How to add a module").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from tether.modserver.agent_auth import AgentAuthenticator
from tether.modserver.agent_conn import AgentConn, AgentIdFromRequest
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.audit import AuditSink
from tether.modserver.config import KasConfigBase
from tether.modserver.gitlab_client import GitlabClient
from tether.modshared.module import Module, Spawner
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2 as kubernetes_api_pb2
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2 as reverse_tunnel_pb2
from tether.tool.events import EventBus
from tether.tool.rate_limit import RateLimiter

#: A path kas serves itself on the Kubernetes API proxy endpoint, behind its authentication (e.g. the Graph API):
#: (request, agent id, identity to impose or None for the agent's own, call metadata such as the request id) ->
#: response. The identity is not optional: a handler that cannot act as it must refuse (e.g. 403 / a policy close).
ProxyPathHandler = Callable[
    [web.BaseRequest, int, kubernetes_api_pb2.ImpersonationConfig | None, tuple[tuple[str, str], ...]],
    Awaitable[web.StreamResponse],
]

#: The servicer context of one agentk ``ReverseTunnel.Connect`` stream.
ConnectContext = grpc.aio.ServicerContext[reverse_tunnel_pb2.ConnectRequest, reverse_tunnel_pb2.ConnectResponse]


class TunnelHandler(Protocol):
    """Takes the reverse tunnels agentk opens (upstream ``reverse_tunnel``'s ``TunnelHandler``)."""

    async def accept_tunnel(
        self,
        agent_id: int,
        descriptor: info_pb2.AgentDescriptor,
        context: ConnectContext,
        connection_id: int | None,
        max_age_s: float,
    ) -> tuple[grpc.StatusCode, str] | None:
        """Hold one tunnel, its descriptor already read, until it is finished; return the status it ends with.

        Args:
            agent_id: the authenticated agent.
            descriptor: the APIs the agent advertises.
            context: the ``Connect`` stream; the tunnel reads and writes it from now on.
            connection_id: the agent connection's id for logs, or None.
            max_age_s: an idle tunnel is retired with OK after this long (kas.md §8.3).
        """


S = TypeVar("S", bound=BaseModel)


@dataclass
class ServerApi:
    """Everything a kas module may use (upstream ``modserver.Config``).

    Attributes:
        config: the shared sections of the validated kas configuration (listeners, the hub, routing...).
        gitlab: the hub's internal API client (``/api/v4/internal/kubernetes/...``).
        auth: agent token authentication, cached (kas.md §2.3).
        events: the pub/sub event bus on ``<prefix>:kas_events``.
        agent_conn: calls any agent's API, wherever its tunnels are (the one way a module reaches an agent).
        tunnel_handler: takes the reverse tunnels agentk opens (for ``reverse_tunnel``).
        agent_tracker: connected agents by agent id / project id (kas.md §3.3).
        metrics: the Prometheus registry served on the observability listener.
        agent_server: the agent gRPC listener (agentk calls); register services before start.
        api_server: the api gRPC listener (hub calls, JWT-authenticated).
        private_server: the private api gRPC listener (other kas).
        stopping: set when kas begins to shut down; long polls end on it.
        spawn: starts a supervised background loop.
        rate_limiter: rate limits shared by every kas through Redis (memory without Redis), or None.
        routed_methods: agent methods the api listener routes to agents; fill with :meth:`register_agent_api`.
        ports: listener name -> bound TCP port; a module with its own listener adds it here.
        proxy_paths: paths under the Kubernetes API proxy's prefix that kas answers itself; fill with
            :meth:`register_proxy_path`.
        sections: the modules' configuration sections by model (read with :meth:`section`).
        audit: where relays record each request (issue 25 item 1): ``audit.begin(...)`` when a request arrives,
            ``record.finish(status)`` when it ends, or ``audit.record(event)`` for a ready-made ``AuditEvent``;
            neither blocks nor raises. The ``audit`` module installs its sink; the base one drops records.
        kas_instance: this kas' name in audit events (its private API URL).
    """

    config: KasConfigBase
    gitlab: GitlabClient
    auth: AgentAuthenticator
    events: EventBus
    agent_conn: AgentConn
    tunnel_handler: TunnelHandler
    agent_tracker: AgentTracker
    metrics: CollectorRegistry
    agent_server: grpc.aio.Server
    api_server: grpc.aio.Server
    private_server: grpc.aio.Server
    stopping: asyncio.Event
    spawn: Spawner
    rate_limiter: RateLimiter | None = None
    routed_methods: dict[str, AgentIdFromRequest] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    proxy_paths: dict[str, ProxyPathHandler] = field(default_factory=dict)
    sections: Mapping[type[BaseModel], BaseModel | None] = field(default_factory=dict)
    audit: AuditSink = field(default_factory=AuditSink)
    kas_instance: str = ""

    def section(self, model: type[S]) -> S | None:
        """A module's own configuration section (declared in its folder), or None when the file has none.

        Raises:
            KeyError: the process does not know ``model`` (not listed in ``tether.kas.config.module_sections``).
        """
        value = self.sections[model]
        if value is None:
            return None
        assert isinstance(value, model)
        return value

    @property
    def long_poll_age_s(self) -> float:
        """How long idle tunnels and configuration streams live: 30 % of the agent listener's max age.

        They then end just after the connection's GOAWAY, so agentk reconnects elsewhere (kas.md §8.3).
        """
        return self.config.agent.listen.max_connection_age * 0.3

    def register_agent_api(self, methods: Mapping[str, AgentIdFromRequest]) -> None:
        """Declare agentk methods the hub may call on the api listener (upstream ``RegisterAgentApi``).

        Args:
            methods: ``/package.Service/Method`` -> how to read the destination agent id from a request.

        Raises:
            ValueError: a method is already registered by another module.
        """
        for method, agent_id_of in methods.items():
            if method in self.routed_methods:
                raise ValueError(f"agent method {method} is registered twice")
            self.routed_methods[method] = agent_id_of

    def register_proxy_path(self, path: str, handler: ProxyPathHandler) -> None:
        """Serve ``path`` (below the proxy's ``url_path_prefix``, e.g. ``/graph``) on the Kubernetes API proxy.

        The proxy authenticates the request as for any proxied one and calls ``handler`` instead of relaying it
        to the agent (issue 9 item 1: the handler gets the identity the proxy imposes).

        Raises:
            ValueError: the path is already registered by another module.
        """
        if path in self.proxy_paths:
            raise ValueError(f"proxy path {path} is registered twice")
        self.proxy_paths[path] = handler


class ServerModuleFactory(Protocol):
    """Builds one kas module (upstream ``modserver.Factory``)."""

    @property
    def name(self) -> str:
        """The module's name."""

    def new(self, api: ServerApi) -> Module | None:
        """Register the module's services on ``api``'s listeners and return it, or None when not configured.

        Raises:
            Exception: the module cannot be built; kas does not start (reported as a start error).
        """
