"""An agent embedded in a Python process: agentk's internal server and tunnel pool with caller-chosen modules.

``tether agentk`` is the product; this is the same machinery for programs that serve agent APIs of their
own through kas (tests, benchmarks, simulators). It holds reverse tunnels only; it opens no
configuration stream, so it does not appear as a connected agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from grpc import aio

from tether.modagent.internal_server import InternalServer
from tether.tool.backoff import channel_reconnect_options
from tether.tool.grpc_stream import BOUNDED_WINDOW_OPTIONS
from tether.tunnel.agent.connection import ConnectedTunnels, TunnelConnection
from tether.tunnel.agent.pool import ConnectionPool, PoolLimits, TunnelListener


class _FirstTunnel(ConnectedTunnels):
    def __init__(self) -> None:
        super().__init__()
        self.first = asyncio.Event()
        self.first_at = 0.0

    def add(self, delta: int) -> None:
        super().add(delta)
        if delta > 0 and not self.first.is_set():
            self.first_at = asyncio.get_running_loop().time()
            self.first.set()


class EmbeddedAgent:
    """Serves the registered modules to kas through reverse tunnels.

    Args:
        kas_target: gRPC target of kas' agent listener, e.g. ``127.0.0.1:8150``.
        token: the agent token.
        limits: tunnel pool limits (upstream defaults when None).
    """

    def __init__(self, kas_target: str, token: str, limits: PoolLimits | None = None) -> None:
        self.kas_target = kas_target
        self.token = token
        self.limits = limits
        self.internal = InternalServer()
        self._tunnels = _FirstTunnel()
        self._kas_channel: aio.Channel | None = None
        self.pool: ConnectionPool | None = None

    def add_servicer(self, register_fn: Callable[..., Any], servicer: Any) -> None:
        """Register a generated servicer (``add_XServicer_to_server``) before :meth:`start`."""
        self.internal.add_servicer(register_fn, servicer)

    def add_generic_handler(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]) -> None:
        """Register raw method handlers of ``service`` (full proto name) before :meth:`start`."""
        self.internal.add_generic_handler(service, handlers)

    async def start(self) -> None:
        """Start the internal server and the tunnel pool."""
        await self.internal.start()
        self._kas_channel = aio.insecure_channel(
            self.kas_target,
            # Its own HTTP/2 connection, like a real agentk: grpcio otherwise shares one between every embedded
            # agent of the process, and kas caps tunnels per connection (agent.listen.max_tunnels_per_connection).
            options=[
                ("grpc.lb_policy_name", "round_robin"),
                ("grpc.use_local_subchannel_pool", 1),
                *channel_reconnect_options(),
                *BOUNDED_WINDOW_OPTIONS,
            ],
        )
        descriptor = self.internal.descriptor()
        metadata = (("authorization", f"Bearer {self.token}"),)
        channel = self._kas_channel

        def factory(listener: TunnelListener) -> TunnelConnection:
            return TunnelConnection(
                channel, self.internal.handler, descriptor, listener, metadata=metadata, connected=self._tunnels
            )

        self.pool = ConnectionPool(factory, limits=self.limits)
        self.pool.start()

    async def wait_first_tunnel(self) -> float:
        """Wait until a tunnel is connected; return when that happened (event-loop clock, seconds)."""
        await self._tunnels.first.wait()
        return self._tunnels.first_at

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop the pool (in-flight calls get ``grace_s`` seconds), the channel and the internal server."""
        if self.pool is not None:
            await self.pool.stop(grace_s=grace_s)
        if self._kas_channel is not None:
            await self._kas_channel.close()
        await self.internal.stop(None)
