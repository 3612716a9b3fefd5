"""agentk's real tunnel machinery (internal server, tunnel pool) run inside the test process.

Tests and benchmarks use it to serve modules of their own (a deliberately slow one, a streaming one)
through real kas processes, which the ``tether agentk`` binary has no reason to ship.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpc import aio

from tether.agentk.internal_server import InternalServer
from tether.modules.reverse_tunnel.agent_connection import TunnelConnection
from tether.modules.reverse_tunnel.agent_pool import ConnectionPool, TunnelListener


class InProcessAgent:
    """An agent with one kas connection and the given modules registered on its internal server."""

    def __init__(self, kas_target: str, token: str, register: list[tuple[Callable[..., Any], Any]]) -> None:
        self.kas_target = kas_target
        self.token = token
        self.internal = InternalServer()
        for register_fn, servicer in register:
            self.internal.add_servicer(register_fn, servicer)
        self.kas_channel: aio.Channel | None = None
        self.pool: ConnectionPool | None = None

    async def start(self) -> None:
        await self.internal.start()
        self.kas_channel = aio.insecure_channel(self.kas_target, options=[("grpc.lb_policy_name", "round_robin")])
        descriptor = self.internal.descriptor()
        metadata = (("authorization", f"Bearer {self.token}"),)

        def factory(listener: TunnelListener) -> TunnelConnection:
            assert self.kas_channel is not None
            return TunnelConnection(self.kas_channel, self.internal.channel, descriptor, listener, metadata=metadata)

        self.pool = ConnectionPool(factory)
        self.pool.start()

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.stop(grace_s=1.0)
        if self.kas_channel is not None:
            await self.kas_channel.close()
        await self.internal.stop(None)
