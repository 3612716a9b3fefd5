"""The kas process: builds the shared services and listeners, runs the modules of ``SERVER_MODULES``.

Listeners (kas.md §0.1): agent gRPC (agentk), api gRPC (the hub; JWT ``iss=gitlab``, ``aud=gitlab-kas``),
private api gRPC (other kas only; JWT ``iss=aud=gitlab-kas`` with a kas-only secret), observability
HTTP and, when ``agent.kubernetes_api`` is configured, the Kubernetes API proxy (HTTP, kas.md §5).
On SIGTERM (kas.md §8.6; issue 26 item 3 "rolling update without a failed request"): readiness turns false
and configuration streams end with OK at once; after ``agent.listen.listen_grace_period`` the agent and api
listeners stop accepting (GOAWAY: agentk's and the hub's new calls go to another kas through the load
balancer) and the tunnel registry drains: each agent moves to another kas make-before-break (its idle tunnels
here keep serving until it has tunnels elsewhere, at most ``routing.agent_move_timeout``), and this kas' tunnel
tracker entry for it goes the moment it moved. Then everything else this kas wrote to Redis is removed, the
private listener stops accepting, and in-flight forwarded calls get what remains of
``routing.shutdown_grace_period`` (proxied HTTP requests: ``agent.kubernetes_api.listen.shutdown_grace_period``);
the tunnels still open then end with OK (``kas/shutdown.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import CollectorRegistry

from tether import __version__
from tether.kas.config import KasConfig, module_sections
from tether.kas.errors import KasStartError
from tether.kas.listeners import GrpcListeners, load_secrets, own_private_api_url
from tether.kas.loops import AgentCount, kas_loops
from tether.kas.modules import SERVER_MODULES
from tether.kas.observability import BuildInfo, ObservabilityServer, kas_gauges
from tether.kas.services import KasServices, build_services
from tether.kas.shutdown import drain
from tether.kas.state import redis_target
from tether.kas.token_revocation import TokenRevocationService
from tether.modserver.api import ServerApi, ServerModuleFactory
from tether.modshared.module import Module, ModuleStartError
from tether.modshared.supervisor import ModuleSupervisor
from tether.pb.gitlab.agent.kas.instance_pb2 import KasInstanceInfo
from tether.tool.logs import set_process_fields
from tether.tool.memory import freeze_startup_heap, space_full_collections
from tether.tool.tasks import wait_or_abandon
from tether.tunnel.server.agent_conn import RoutedAgentConn
from tether.tunnel.server.grpc_handlers import PrivateApiHandler, RoutedApiHandler

__all__ = ["KasApp", "KasStartError", "own_private_api_url", "redis_target"]

log = logging.getLogger(__name__)


def _instance_info(own_url: str, commit: str) -> KasInstanceInfo:
    started_at = Timestamp()
    started_at.GetCurrentTime()
    return KasInstanceInfo(version=__version__, commit=commit, private_api_url=own_url, started_at=started_at)


def _server_api(
    config: KasConfig,
    services: KasServices,
    listeners: GrpcListeners,
    metrics: CollectorRegistry,
    stopping: asyncio.Event,
    supervisor: ModuleSupervisor,
    own_url: str,
) -> ServerApi:
    state, routing = services.state, services.routing
    return ServerApi(
        config=config,
        gitlab=services.gitlab,
        auth=services.auth,
        events=state.events,
        agent_conn=RoutedAgentConn(routing.router),
        tunnel_handler=routing.registry,
        agent_tracker=state.agent_tracker,
        metrics=metrics,
        agent_server=listeners.agent,
        api_server=listeners.api,
        private_server=listeners.private,
        stopping=stopping,
        spawn=supervisor.spawn,
        rate_limiter=state.rate_limiter,
        sections=module_sections(config),
        kas_instance=own_url,
    )


class KasApp:
    """One kas instance: the shared services, the listeners, kas' own services and the modules, as lists.

    Args:
        config: the validated configuration.
        commit: build identifier reported in ``KasInstanceInfo``.
        modules: module factories in start order (default: :data:`tether.kas.modules.SERVER_MODULES`).

    Raises:
        KasStartError: a secret is unusable, or a module cannot be built.
    """

    def __init__(
        self, config: KasConfig, commit: str = "", modules: Sequence[ServerModuleFactory] | None = None
    ) -> None:
        self.config = config
        self.stopping = asyncio.Event()
        self._listening = False
        secrets = load_secrets(config)
        self.own_url = own_private_api_url(config)
        set_process_fields(kas_url=self.own_url)
        self.instance_info = _instance_info(self.own_url, commit)
        self.services = build_services(config, self.own_url, secrets)
        self.metrics = CollectorRegistry()
        self.supervisor = ModuleSupervisor("kas", self.metrics)
        self.agent_count = AgentCount(self.services.state)
        registry = self.services.routing.registry
        self.metrics.register(kas_gauges(registry.idle_count, registry.waiting_count, lambda: self.agent_count.value))
        self.metrics.register(BuildInfo(__version__, commit))
        self.observability = ObservabilityServer(
            config.observability, [self._ready_probe, self._backend_probe], self.metrics
        )
        self.listeners = GrpcListeners(config, secrets, self.services.auth, self.services.state.rate_limiter)
        self.api = _server_api(
            config, self.services, self.listeners, self.metrics, self.stopping, self.supervisor, self.own_url
        )
        self.modules: list[Module] = [self._token_revocation()]
        for factory in SERVER_MODULES if modules is None else modules:
            module = factory.new(self.api)
            if module is not None:
                self.modules.append(module)
        # Listeners' own handlers come after the modules' services.
        routing = self.services.routing
        routed = RoutedApiHandler(routing.router, self.api.routed_methods, self.api.audit)
        self.listeners.api.add_generic_rpc_handlers([routed])
        self.listeners.private.add_generic_rpc_handlers([PrivateApiHandler(routing.gateway)])

    def _token_revocation(self) -> TokenRevocationService:
        state, agent = self.services.state, self.config.agent
        return TokenRevocationService(
            state.events,
            self.services.auth,
            state.backend,
            state.prefix,
            agent,
            self.listeners.api,
            self.supervisor.spawn,
        )

    @property
    def ports(self) -> dict[str, int]:
        """Listener name -> bound TCP port, once started."""
        return self.api.ports

    async def _ready_probe(self) -> str | None:
        if self.stopping.is_set():
            return "shutting down"
        return None if self._listening else "listeners not started"

    async def _backend_probe(self) -> str | None:
        await wait_or_abandon(self.services.state.backend.ping(), 2.0)
        return None

    async def start(self) -> None:
        """Bind every listener, start kas' services and the modules in order, then the background loops.

        Raises:
            KasStartError: a listener cannot bind or a module cannot start.
        """
        await self.observability.start()
        self.ports.update(self.listeners.bind())
        try:
            await self.supervisor.start(self.modules)
        except ModuleStartError as exc:
            raise KasStartError(str(exc)) from exc
        await self.services.prime_breakers()
        await self.listeners.start()
        for name, run in kas_loops(self.services, self.agent_count).items():
            self.supervisor.spawn(name, run)  # a crash is logged, counted and restarted (issue 24 item 3)
        with contextlib.suppress(Exception):
            await self.services.state.instances.register(self.instance_info)
        self._listening = True
        freeze_startup_heap()
        space_full_collections()
        log.info("kas started", extra={"kas_url": self.own_url, "ports": self.ports})

    async def stop(self) -> None:
        """Shut down as described in the module docstring; safe to call twice."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        began = time.monotonic()
        # Modules with listeners of their own (the Kubernetes API proxy) relay in-flight requests (watches,
        # upgrades) through the routing below, so their grace periods run alongside, and they are stopped
        # before routing's connections close.
        modules_stopped = asyncio.ensure_future(self.supervisor.stop_modules())
        await asyncio.sleep(self.config.agent.listen.listen_grace_period)
        await drain(self.config, self.services, self.listeners)
        await self.supervisor.cancel_loops()
        await modules_stopped
        await self.services.close_clients()
        await self.observability.stop()
        await self.services.state.backend.close()
        log.info("kas stopped in %.1fs", time.monotonic() - began)
