"""kas' ``ReverseTunnel.Connect`` handler on the agent listener (kas.md §1.5).

Authenticates the agent, requires the descriptor as the first message, then hands the stream to the
tunnel registry and ends the RPC with the status the tunnel finished with.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import grpc

from tether.kas.agent_auth import AgentAuthenticator, AuthError
from tether.modules.reverse_tunnel.registry import TunnelRegistry
from tether.modules.reverse_tunnel.tunnel import ConnectContext, Tunnel
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2, rpc_pb2_grpc
from tether.tool.automaton import StreamAutomaton, StreamOrderError

log = logging.getLogger(__name__)


class ReverseTunnelServicer(rpc_pb2_grpc.ReverseTunnelServicer):
    """Serves ``/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect``.

    Args:
        registry: where tunnels wait for calls.
        auth: resolves the agent token.
        max_connection_age_s: an idle tunnel is retired with OK after about this long (±5 % jitter), so
            agentk moves to a fresh connection before load balancers cut it (kas.md §8.3).
    """

    def __init__(self, registry: TunnelRegistry, auth: AgentAuthenticator, max_connection_age_s: float) -> None:
        self._registry = registry
        self._auth = auth
        self._max_age_s = max_connection_age_s

    async def Connect(self, request_iterator: Any, context: ConnectContext) -> None:  # type: ignore[override]
        """Handle one tunnel for its whole life; see the module docstring."""
        try:
            agent = await self._auth.authenticate(context.invocation_metadata())
            with self._auth.hold(context.invocation_metadata()):  # a revoked token's tunnels are cancelled
                await self._serve(agent.agent_id, context)
        except AuthError as exc:
            await context.abort(exc.code, exc.message)

    async def _serve(self, agent_id: int, context: ConnectContext) -> None:
        first: Any = await context.read()
        if first is grpc.aio.EOF:
            return
        try:
            if StreamAutomaton(rpc_pb2.ConnectRequest).visit(first) != "descriptor":
                raise StreamOrderError("first message must be descriptor")
        except StreamOrderError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid tunnel stream: {exc}")
        if not first.descriptor.agent_descriptor.services:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "descriptor advertises no services")
        tunnel = Tunnel(agent_id, first.descriptor.agent_descriptor, context)
        age_s = self._max_age_s * random.uniform(0.95, 1.0)
        status = await self._registry.handle_tunnel(tunnel, age_s)
        if status is not None and status[0] is not grpc.StatusCode.OK:
            await context.abort(status[0], status[1])
