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
``routing.shutdown_grace_period`` (proxied HTTP requests: ``agent.kubernetes_api.listen.shutdown_grace_period``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import CollectorRegistry

from tether import __version__
from tether.kas.instance_registry import KasInstanceRegistry
from tether.kas.modules import SERVER_MODULES
from tether.kas.observability import GaugeCollector, ObservabilityServer
from tether.kas.token_revocation import (
    AgentTokensServicer,
    RevocationList,
    list_ttl_s,
    revalidate_forever,
    subscribe_revocations,
)
from tether.modserver.agent_auth import AgentAuthenticator, AgentAuthInterceptor
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.api import ServerApi, ServerModuleFactory
from tether.modserver.config import KasConfig, ListenCF, sentinel_host_port
from tether.modserver.gitlab_client import GitlabClient
from tether.modshared.module import Module, ModuleStartError
from tether.modshared.supervisor import ModuleSupervisor
from tether.pb.gitlab.agent.agent_tokens.rpc import rpc_pb2_grpc as tokens_grpc
from tether.pb.gitlab.agent.event.event_pb2 import TunnelsAvailable
from tether.pb.gitlab.agent.kas.instance_pb2 import KasInstanceInfo
from tether.tool.backoff import Backoff
from tether.tool.events import EventBus
from tether.tool.expiring_hash import EntryTtl, HashBackend
from tether.tool.grpc_size import receive_limit_options
from tether.tool.grpc_stream import BOUNDED_WINDOW_OPTIONS, PENDING_RPC_OPTIONS
from tether.tool.jwt_auth import AUDIENCE_KAS, ISSUER_GITLAB, ISSUER_KAS, JwtServerInterceptor, JwtVerifier
from tether.tool.logs import set_process_fields
from tether.tool.memory import freeze_startup_heap, space_full_collections
from tether.tool.memory_backend import MemoryBackend
from tether.tool.rate_limit import RateLimiter
from tether.tool.secrets import SecretError, load_base64_secret
from tether.tunnel.server.agent_conn import RoutedAgentConn
from tether.tunnel.server.gateway import Gateway
from tether.tunnel.server.grpc_handlers import PrivateApiHandler, RoutedApiHandler
from tether.tunnel.server.kas_pool import KasPool
from tether.tunnel.server.notifier import TunnelNotifier
from tether.tunnel.server.registry import TunnelRegistry
from tether.tunnel.server.router import Router, RoutingOptions
from tether.tunnel.server.tracker import TunnelTracker

if TYPE_CHECKING:
    from tether.tool.redis_pool import RedisTarget

log = logging.getLogger(__name__)


class KasStartError(RuntimeError):
    """kas cannot start (bad secret, port in use, wildcard private address without OWN_PRIVATE_API_URL...)."""


def own_private_api_url(config: KasConfig) -> str:
    """This kas' private API URL: ``OWN_PRIVATE_API_URL``, else derived from the listen address (kas.md §2.7).

    Raises:
        KasStartError: the listen address is a wildcard and no URL was given.
    """
    explicit = os.environ.get("OWN_PRIVATE_API_URL")
    if explicit:
        return explicit
    listen = config.private_api.listen
    if listen.network == "unix":
        return f"unix://{listen.address}"
    host, _, port = listen.address.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        raise KasStartError(
            f"private_api.listen.address {listen.address!r} is a wildcard: set OWN_PRIVATE_API_URL "
            "to the URL other kas instances should use, e.g. grpc://10.0.0.5:8155"
        )
    scheme = "grpcs" if listen.certificate_file else "grpc"
    return f"{scheme}://{host}:{port}"


def _redis_backend(config: KasConfig, target: RedisTarget | None) -> HashBackend:
    if target is None or config.redis is None:
        return MemoryBackend()
    from tether.tool.redis_backend import RedisBackend  # noqa: PLC0415 (redis-py only when configured)

    cfg = config.redis
    return RedisBackend.connect(
        target,
        dial_timeout_s=cfg.dial_timeout,
        write_timeout_s=cfg.write_timeout,
        pool_size=cfg.pool_size,
        pool_timeout_s=cfg.pool_timeout,
    )


def _read_password(path: Path, what: str) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise KasStartError(f"{what} {path} cannot be read: {exc.strerror}") from exc


def redis_target(config: KasConfig) -> RedisTarget | None:
    """Where this kas' Redis is, from the ``redis`` section (kas.md §3.1); None without one (memory state).

    Raises:
        KasStartError: a password file cannot be read.
    """
    cfg = config.redis
    if cfg is None:
        return None
    from tether.tool.redis_pool import RedisTarget, SentinelMaster, TlsFiles  # noqa: PLC0415 (redis-py when configured)

    password = _read_password(cfg.password_file, "redis.password_file") if cfg.password_file else None
    tls = None
    if cfg.tls.enabled:
        tls = TlsFiles(cfg.tls.ca_certificate_file, cfg.tls.certificate_file, cfg.tls.key_file)
    if cfg.sentinel is not None:
        sentinel_password = None
        if cfg.sentinel.sentinel_password_file is not None:
            sentinel_password = _read_password(
                cfg.sentinel.sentinel_password_file, "redis.sentinel.sentinel_password_file"
            )
        master = SentinelMaster(
            cfg.sentinel.master_name,
            tuple(sentinel_host_port(address) for address in cfg.sentinel.addresses),
            sentinel_password,
        )
        return RedisTarget(sentinel=master, username=cfg.username, password=password, db=cfg.database_index, tls=tls)
    assert cfg.server is not None
    if cfg.network == "unix":
        url = f"unix://{cfg.server.address}?db={cfg.database_index}"
    else:
        url = f"{'rediss' if tls else 'redis'}://{cfg.server.address}/{cfg.database_index}"
    return RedisTarget(url=url, username=cfg.username, password=password, tls=tls)


def _server_options(max_connection_age_s: float, max_message_size: int) -> list[tuple[str, Any]]:
    return [
        # Core refuses a larger message on its length prefix, before reading it (issue 27, tool/grpc_size).
        *receive_limit_options(max_message_size),
        # Nothing reads channelz; its per-connection node is ~0.5 KiB (bench/grpc_floor.py, issue 9).
        ("grpc.enable_channelz", 0),
        # kas.md §8.3: ping every 50 s; clients may ping every 20 s, also without calls.
        ("grpc.keepalive_time_ms", 50_000),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 20_000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_connection_age_ms", int(max_connection_age_s * 0.2 * 1000)),
        ("grpc.max_connection_age_grace_ms", int(max_connection_age_s * 0.65 * 1000)),
        # grpcio binds with SO_REUSEPORT by default: a port another listener (or another process of the same
        # user) holds would be shared silently, connections split at random between the two.
        ("grpc.so_reuseport", 0),
        *BOUNDED_WINDOW_OPTIONS,
        *PENDING_RPC_OPTIONS,
    ]


def _bind(server: grpc.aio.Server, listen: ListenCF, name: str) -> int:
    address = f"unix:{listen.address}" if listen.network == "unix" else listen.address
    try:
        if listen.certificate_file and listen.key_file:
            credentials = grpc.ssl_server_credentials(
                [(listen.key_file.read_bytes(), listen.certificate_file.read_bytes())]
            )
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise KasStartError(f"{name} listener cannot listen on {listen.address}: {exc}") from exc
    if port == 0 and listen.network != "unix":
        raise KasStartError(f"{name} listener cannot listen on {listen.address} (address in use?)")
    return port


class KasApp:
    """One kas instance: the shared services, the listeners, and the modules of :data:`SERVER_MODULES`.

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
        try:
            gitlab_secret = load_base64_secret(config.gitlab.authentication_secret_file, exact_length=32)
            api_secret = load_base64_secret(config.api.listen.authentication_secret_file)
            private_secret = load_base64_secret(config.private_api.listen.authentication_secret_file)
        except SecretError as exc:
            raise KasStartError(str(exc)) from exc
        if private_secret in (api_secret, gitlab_secret):
            raise KasStartError("private_api secret must differ from the api and gitlab secrets (only kas may know it)")
        prefix = config.redis.key_prefix if config.redis else "gitlab-kas"
        agent = config.agent
        self.own_url = own_private_api_url(config)
        set_process_fields(kas_url=self.own_url)
        target = redis_target(config)
        self.backend = _redis_backend(config, target)
        pool = (config.redis.pool_size, config.redis.pool_timeout) if config.redis else (100, 5.0)
        self.rate_limiter = RateLimiter(target, f"{prefix}:rate_limit", pool_size=pool[0], pool_timeout_s=pool[1])
        self.events = EventBus(self.backend, prefix)
        ttl = EntryTtl(agent.redis_conn_info_ttl, agent.redis_conn_info_refresh, agent.redis_conn_info_gc)
        self.tunnel_tracker = TunnelTracker(self.backend, self.events, self.own_url, prefix, ttl)
        self.agent_tracker = AgentTracker(self.backend, self.events, prefix, ttl, kas_url=self.own_url)
        self.instances = KasInstanceRegistry(self.backend, prefix, ttl)
        started_at = Timestamp()
        started_at.GetCurrentTime()
        self.instance_info = KasInstanceInfo(
            version=__version__, commit=commit, private_api_url=self.own_url, started_at=started_at
        )
        self.registry = TunnelRegistry(self.tunnel_tracker)
        self.notifier = TunnelNotifier()
        self.events.on(TunnelsAvailable, self._on_tunnels_available)
        self.gateway = Gateway(self.registry)
        self.pool = KasPool(
            private_secret, config.private_api.listen.ca_certificate_file, agent.listen.max_message_size
        )
        routing = config.routing
        self.router = Router(
            self.own_url,
            self.gateway,
            self.pool,
            self.tunnel_tracker,
            self.notifier,
            RoutingOptions(routing.tunnel_find_timeout, routing.try_new_kas_interval, routing.recheck_interval),
        )
        self.gitlab = GitlabClient(config.gitlab.address, gitlab_secret, config.gitlab.request_timeout)
        self.auth = AgentAuthenticator(
            self.gitlab,
            self.backend,
            prefix,
            agent.info_cache_ttl,
            agent.info_cache_error_ttl,
        )
        subscribe_revocations(self.events, self.auth)
        self.revocations = RevocationList(
            self.backend, prefix, list_ttl_s(agent.info_cache_ttl, agent.token_revalidation_period)
        )
        self._connected_agents = 0.0
        self.metrics = CollectorRegistry()
        self.supervisor = ModuleSupervisor("kas", self.metrics)
        self.metrics.register(
            GaugeCollector(
                {
                    "tunnels_idle": (
                        "Idle reverse tunnels held by this kas",
                        lambda: float(self.registry.idle_count()),
                    ),
                    "tunnel_find_requests_waiting": (
                        "Requests waiting for a tunnel on this kas",
                        lambda: float(self.registry.waiting_count()),
                    ),
                    "connected_agents_count": ("Connected agents (all kas instances)", lambda: self._connected_agents),
                }
            )
        )
        self.observability = ObservabilityServer(
            config.observability, [self._ready_probe, self._backend_probe], self.metrics
        )
        self.agent_server = self._server(
            agent.listen.max_connection_age,
            AgentAuthInterceptor(self.auth, self.rate_limiter, agent.listen.connections_per_token_per_minute),
        )
        self.api_server = self._server(
            config.api.listen.max_connection_age,
            JwtServerInterceptor(JwtVerifier(api_secret, AUDIENCE_KAS, ISSUER_GITLAB)),
        )
        tokens_grpc.add_AgentTokensServicer_to_server(
            AgentTokensServicer(self.events, self.auth, self.revocations), self.api_server
        )
        self.private_server = self._server(
            config.private_api.listen.max_connection_age,
            JwtServerInterceptor(JwtVerifier(private_secret, AUDIENCE_KAS, ISSUER_KAS)),
        )
        self.api = ServerApi(
            config=config,
            gitlab=self.gitlab,
            auth=self.auth,
            events=self.events,
            agent_conn=RoutedAgentConn(self.router),
            tunnel_handler=self.registry,
            agent_tracker=self.agent_tracker,
            metrics=self.metrics,
            agent_server=self.agent_server,
            api_server=self.api_server,
            private_server=self.private_server,
            stopping=self.stopping,
            spawn=self.supervisor.spawn,
            rate_limiter=self.rate_limiter,
        )
        self.modules: list[Module] = []
        for factory in SERVER_MODULES if modules is None else modules:
            module = factory.new(self.api)
            if module is not None:
                self.modules.append(module)
        # Listeners' own handlers come after the modules' services.
        self.api_server.add_generic_rpc_handlers([RoutedApiHandler(self.router, self.api.routed_methods)])
        self.private_server.add_generic_rpc_handlers([PrivateApiHandler(self.gateway)])

    def _on_tunnels_available(self, event: TunnelsAvailable) -> None:
        self.notifier.notify(event.agent_id, event.kas_url)
        if event.kas_url != self.own_url:
            self.registry.moved(event.agent_id)  # while draining: the agent has tunnels on that kas now

    async def _has_tunnels_elsewhere(self, agent_id: int) -> bool:
        try:
            urls = await asyncio.wait_for(self.tunnel_tracker.kas_urls(agent_id), 2.0)
        except Exception:
            return False  # then one tunnel moves and the others wait for the announcement
        return any(url != self.own_url for url in urls)

    async def _other_instances(self) -> bool:
        try:
            listed = await asyncio.wait_for(self.instances.instances(), 2.0)
        except Exception:
            return True  # unknown: give the agents their chance to move
        return any(info.private_api_url != self.own_url for info in listed)

    @property
    def ports(self) -> dict[str, int]:
        """Listener name -> bound TCP port, once started."""
        return self.api.ports

    def _server(self, max_connection_age_s: float, interceptor: grpc.aio.ServerInterceptor) -> grpc.aio.Server:
        # Every listener checks its callers before any request is decoded (agent token or JWT).
        return grpc.aio.server(
            options=_server_options(max_connection_age_s, self.config.agent.listen.max_message_size),
            interceptors=[interceptor],
        )

    async def _ready_probe(self) -> str | None:
        if self.stopping.is_set():
            return "shutting down"
        return None if self._listening else "listeners not started"

    async def _backend_probe(self) -> str | None:
        await asyncio.wait_for(self.backend.ping(), timeout=2.0)
        return None

    async def start(self) -> None:
        """Bind every listener, start the modules in order and the background loops.

        Raises:
            KasStartError: a listener cannot bind or a module cannot start.
        """
        await self.observability.start()
        self.ports.update(
            {
                "agent": _bind(self.agent_server, self.config.agent.listen, "agent"),
                "api": _bind(self.api_server, self.config.api.listen, "api"),
                "private_api": _bind(self.private_server, self.config.private_api.listen, "private_api"),
            }
        )
        try:
            await self.supervisor.start(self.modules)
        except ModuleStartError as exc:
            raise KasStartError(str(exc)) from exc
        for server in (self.agent_server, self.api_server, self.private_server):
            await server.start()
        loops: dict[str, Callable[[], Awaitable[object]]] = {
            "events": self.events.run,
            "tunnel_tracker": self.tunnel_tracker.run,
            "agent_tracker": self.agent_tracker.run,
            "kas_instances": self.instances.run,
            "count_agents": self._count_agents,
            "rebuild_after_reconnect": self._rebuild_after_reconnect,
            "register_failed_tunnels": self.registry.run,
            "close_unused_kas_channels": self._close_unused_channels,
            "token_revalidation": lambda: revalidate_forever(
                self.auth, self.revocations, self.config.agent.token_revalidation_period
            ),
        }
        for name, run in loops.items():
            self.supervisor.spawn(name, run)  # a crash is logged, counted and restarted (issue 24 item 3)
        with contextlib.suppress(Exception):
            await self.instances.register(self.instance_info)
        self._listening = True
        freeze_startup_heap()
        space_full_collections()
        log.info("kas started", extra={"kas_url": self.own_url, "ports": self.ports})

    async def _rebuild_after_reconnect(self) -> None:
        # A re-subscription means Redis was unreachable, maybe restarted empty: re-write our state now
        # instead of waiting for the next periodic refresh, until every part succeeded, then wake routing kas
        # instances that wait for our agents.
        seen = 1
        while True:
            await self.events.wait_subscribed(seen + 1)
            seen = self.events.subscriptions
            backoff = Backoff(initial_s=0.2, max_s=2.0, jitter=0.2)
            while True:
                results = await asyncio.gather(
                    self.tunnel_tracker.refresh(),
                    self.registry.register_failed(),
                    self.agent_tracker.rebuild(),
                    self.instances.refresh(),
                    return_exceptions=True,
                )
                failures = [r for r in results if isinstance(r, BaseException)]
                if not failures:
                    break
                delay = backoff.next_delay()
                log.warning(
                    "re-writing state after reconnecting to Redis failed (%s); again in %.1f s", failures[0], delay
                )
                await asyncio.sleep(delay)
            log.info("state re-written after reconnecting to Redis: %s", results)
            try:
                await self.tunnel_tracker.announce(self.tunnel_tracker.registered_agents())
            except Exception as exc:  # best effort: routing kas instances re-read the tracker anyway
                log.warning("announcing this kas' agents after reconnecting to Redis failed: %s", exc)

    async def _close_unused_channels(self) -> None:
        # Channels to kas instances that left would otherwise stay open, reconnecting, forever.
        while True:
            await asyncio.sleep(30.0)
            for url in await self.pool.close_unused():
                log.info("closed the channel to kas %s: unused and not connected", url, extra={"kas_url": url})

    async def _count_agents(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                self._connected_agents = float(await asyncio.wait_for(self.agent_tracker.connected_agent_count(), 1.0))
            await asyncio.sleep(5.0)

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
        routing = self.config.routing
        grace_ends = time.monotonic() + routing.shutdown_grace_period
        # No new agent connections or hub calls from now on: they go to another kas.
        stopping_servers = [
            asyncio.ensure_future(self.agent_server.stop(routing.shutdown_grace_period)),
            asyncio.ensure_future(self.api_server.stop(routing.shutdown_grace_period)),
        ]
        move_timeout = min(routing.agent_move_timeout, routing.shutdown_grace_period)
        if not await self._other_instances():
            move_timeout = 0.0  # a lone kas: its agents have nowhere to move, waiting would only delay its stop
        with contextlib.suppress(Exception):
            await self.instances.clear()  # other kas stop discovering this one
        unmoved = await self.registry.drain(self._has_tunnels_elsewhere, move_timeout)
        log.info("agents moved to other kas instances (%d had not within %.1f s)", unmoved, move_timeout)
        await self.registry.stop()
        stopping_servers.append(
            asyncio.ensure_future(self.private_server.stop(max(grace_ends - time.monotonic(), 0.0)))
        )
        await asyncio.gather(
            self.tunnel_tracker.clear(), self.agent_tracker.clear(), self.instances.clear(), return_exceptions=True
        )
        await asyncio.gather(*stopping_servers)
        await self.supervisor.cancel_loops()
        await modules_stopped
        await self.pool.close()
        await self.gitlab.close()
        await self.rate_limiter.close()
        await self.auth.close()
        await self.observability.stop()
        await self.backend.close()
        log.info("kas stopped in %.1fs", time.monotonic() - began)
