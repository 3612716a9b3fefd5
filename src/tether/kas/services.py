"""kas' shared services, built once and handed to the modules (kas.md §0.1, §2-§3).

State (the backend, the event bus, the three registries with one :class:`~tether.tool.expiring_hash.EntryTtl`),
routing (the tunnel registry, the gateway, the pool of channels to other kas, the router) and the hub's
internal API with agent token authentication.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tether.kas.config import KasConfig
from tether.kas.instance_registry import KasInstanceRegistry
from tether.kas.listeners import Secrets
from tether.kas.state import redis_target, state_backend
from tether.modserver.agent_auth import AgentAuthenticator
from tether.modserver.agent_tracker import AgentTracker
from tether.modserver.gitlab_client import GitlabClient
from tether.pb.gitlab.agent.event.event_pb2 import TunnelsAvailable
from tether.tool.events import EventBus
from tether.tool.expiring_hash import EntryTtl, HashBackend
from tether.tool.rate_limit import RateLimiter
from tether.tunnel.server.gateway import Gateway
from tether.tunnel.server.kas_pool import KasPool
from tether.tunnel.server.notifier import TunnelNotifier
from tether.tunnel.server.registry import TunnelRegistry
from tether.tunnel.server.router import Router, RoutingOptions
from tether.tunnel.server.tracker import TunnelTracker

__all__ = ["KasServices", "Routing", "State", "build_services"]


@dataclass
class State:
    """What kas writes to Redis (memory without it) and the event bus on it (kas.md §3)."""

    prefix: str
    backend: HashBackend
    rate_limiter: RateLimiter
    events: EventBus
    tunnel_tracker: TunnelTracker
    agent_tracker: AgentTracker
    instances: KasInstanceRegistry


@dataclass
class Routing:
    """How a request reaches an agent: this kas' tunnels, or another kas' through the private api (kas.md §2)."""

    registry: TunnelRegistry
    notifier: TunnelNotifier
    gateway: Gateway
    pool: KasPool
    router: Router


@dataclass
class KasServices:
    """Every shared service of one kas.

    Attributes:
        own_url: this kas' private API URL.
        state: the backend and the registries.
        routing: tunnels and routing.
        gitlab: the hub's internal API client.
        auth: agent token authentication, cached (kas.md §2.3).
    """

    own_url: str
    state: State
    routing: Routing
    gitlab: GitlabClient
    auth: AgentAuthenticator

    async def prime_breakers(self) -> None:
        """Ask Redis once through each breaker on a request's path, so a stall found later costs 0.25 s, not 5 s."""
        await asyncio.gather(self.state.rate_limiter.prime(), self.auth.prime(), self.state.tunnel_tracker.prime())

    async def close_clients(self) -> None:
        """Close the connections to other kas, the hub and the rate limiter's Redis; stop the stall probes.

        The backend stays open.
        """
        await self.routing.pool.close()
        await self.gitlab.close()
        await self.state.rate_limiter.close()
        await self.state.tunnel_tracker.close()
        await self.auth.close()


def _state(config: KasConfig, own_url: str) -> State:
    prefix = config.redis.key_prefix if config.redis else "gitlab-kas"
    target = redis_target(config)
    backend = state_backend(config, target)
    pool = (config.redis.pool_size, config.redis.pool_timeout) if config.redis else (100, 5.0)
    rate_limiter = RateLimiter(target, f"{prefix}:rate_limit", pool_size=pool[0], pool_timeout_s=pool[1])
    events = EventBus(backend, prefix)
    agent = config.agent
    ttl = EntryTtl(agent.redis_conn_info_ttl, agent.redis_conn_info_refresh, agent.redis_conn_info_gc)
    return State(
        prefix=prefix,
        backend=backend,
        rate_limiter=rate_limiter,
        events=events,
        tunnel_tracker=TunnelTracker(backend, events, own_url, prefix, ttl),
        agent_tracker=AgentTracker(backend, events, prefix, ttl, kas_url=own_url),
        instances=KasInstanceRegistry(backend, prefix, ttl),
    )


def _routing(config: KasConfig, own_url: str, state: State, private_secret: bytes) -> Routing:
    registry = TunnelRegistry(state.tunnel_tracker)
    notifier = TunnelNotifier()

    def on_tunnels_available(event: TunnelsAvailable) -> None:
        notifier.notify(event.agent_id, event.kas_url)
        if event.kas_url != own_url:
            registry.moved(event.agent_id)  # while draining: the agent has tunnels on that kas now

    state.events.on(TunnelsAvailable, on_tunnels_available)
    gateway = Gateway(registry)
    pool = KasPool(private_secret, config.private_api.listen.ca_certificate_file, config.agent.listen.max_message_size)
    cfg = config.routing
    router = Router(
        own_url,
        gateway,
        pool,
        state.tunnel_tracker,
        notifier,
        RoutingOptions(cfg.tunnel_find_timeout, cfg.try_new_kas_interval, cfg.recheck_interval),
    )
    return Routing(registry, notifier, gateway, pool, router)


def build_services(config: KasConfig, own_url: str, secrets: Secrets) -> KasServices:
    """Build the shared services (nothing connects yet: Redis and the hub are dialled on first use).

    Raises:
        tether.kas.errors.KasStartError: a Redis password file cannot be read.
    """
    state = _state(config, own_url)
    routing = _routing(config, own_url, state, secrets.private)
    gitlab = GitlabClient(config.gitlab.address, secrets.gitlab, config.gitlab.request_timeout)
    agent = config.agent
    auth = AgentAuthenticator(gitlab, state.backend, state.prefix, agent.info_cache_ttl, agent.info_cache_error_ttl)
    return KasServices(own_url, state, routing, gitlab, auth)
