"""kas' ``ReverseTunnel.Connect`` handler on the agent listener (kas.md §1.5).

Authenticates the agent, requires the descriptor as the first message, then hands the stream to the
tunnel registry and ends the RPC with the status the tunnel finished with.

Tunnels are capped per agent and per connection (the caller's address, one per HTTP/2 connection); a tunnel
beyond either cap is refused with ``RESOURCE_EXHAUSTED`` naming the limit (issue 9 item 7: one token held
2,480 tunnels). agentk backs off and retries, by then a tunnel may have ended.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from typing import Any

import grpc

from tether.modserver.agent_auth import AgentAuthenticator, AuthError
from tether.modserver.api import ConnectContext, ServerApi, TunnelHandler
from tether.modshared.module import IdleModule, Module
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2, rpc_pb2_grpc
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.logs import current_connection_id

log = logging.getLogger(__name__)

#: agentk sends its descriptor at once; a peer that stalls before it is cut (issue 9 item 5) after this long when no
#: other tunnel waits for its descriptor (kas had nothing else to read: the peer is the one behind).
DESCRIPTOR_TIMEOUT_S = 10.0
#: ... and after this long while other tunnels wait too (issue 28 item 5): in a connection storm on a saturated
#: machine the peers and kas are behind together, and cutting a tunnel only makes agentk open it again.
DESCRIPTOR_MAX_TIMEOUT_S = 60.0


class DescriptorWaits:
    """How many tunnels wait for their descriptor on this kas (issue 28 item 5).

    During a 10,000-agent storm on a saturated machine kas cut tunnels after 10 s without their descriptor
    (``DEADLINE_EXCEEDED``), although the agents had sent it at once: each was re-opened a second later, and the
    repeated work (authentication, rate limit, registration) lengthened the storm. A tunnel that waits alone is
    still cut after :data:`DESCRIPTOR_TIMEOUT_S`; one that waits among others gets :data:`DESCRIPTOR_MAX_TIMEOUT_S`.
    A peer holding stalled tunnels on purpose keeps each at most that long, and opens at most
    ``agent.listen.connections_per_token_per_minute`` per token.
    """

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting = 0

    def start(self) -> None:
        """A tunnel starts waiting for its descriptor."""
        self._waiting += 1

    def stop(self) -> None:
        """A tunnel stopped waiting (its descriptor came, it ended, or it was cut)."""
        self._waiting -= 1

    def alone(self) -> bool:
        """Whether the calling waiting tunnel is the only one."""
        return self._waiting <= 1


class _TooManyTunnels(Exception):
    """A tunnel beyond a cap; the message names the limit."""


class ReverseTunnelServicer(rpc_pb2_grpc.ReverseTunnelServicer):
    """Serves ``/gitlab.agent.reverse_tunnel.rpc.ReverseTunnel/Connect``.

    Args:
        tunnels: where tunnels wait for calls.
        auth: resolves the agent token.
        max_connection_age_s: an idle tunnel is retired with OK after about this long (±5 % jitter), so
            agentk moves to a fresh connection before load balancers cut it (kas.md §8.3).
    """

    def __init__(
        self,
        tunnels: TunnelHandler,
        auth: AgentAuthenticator,
        max_connection_age_s: float,
        max_per_agent: int = 2000,
        max_per_connection: int = 500,
    ) -> None:
        self._tunnels = tunnels
        self._auth = auth
        self._max_age_s = max_connection_age_s
        self._max_per_agent = max_per_agent
        self._max_per_connection = max_per_connection
        self._per_agent: Counter[int] = Counter()
        self._per_connection: Counter[str] = Counter()
        self._waits = DescriptorWaits()

    async def Connect(self, request_iterator: Any, context: ConnectContext) -> None:  # type: ignore[override]
        """Handle one tunnel for its whole life; see the module docstring."""
        try:
            agent = await self._auth.authenticate(context.invocation_metadata())
            with self._auth.hold(context.invocation_metadata()):  # a revoked token's tunnels are cancelled
                await self._serve(agent.agent_id, context)
        except AuthError as exc:
            await exc.abort(context)
        except _TooManyTunnels as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

    def _take(self, agent_id: int, peer: str) -> None:
        # A pair of calls, not a generator context manager: its frame would live as long as the tunnel.
        if self._per_connection[peer] >= self._max_per_connection:
            raise _TooManyTunnels(
                f"this connection holds {self._per_connection[peer]} tunnels (of all its agents), the most kas "
                f"accepts (agent.listen.max_tunnels_per_connection); agent {agent_id} asked for one more"
            )
        if self._per_agent[agent_id] >= self._max_per_agent:
            raise _TooManyTunnels(
                f"agent {agent_id} holds {self._per_agent[agent_id]} tunnels on this kas, the most it accepts "
                f"(agent.listen.max_tunnels_per_agent)"
            )
        self._per_agent[agent_id] += 1
        self._per_connection[peer] += 1

    def _release(self, agent_id: int, peer: str) -> None:
        # In place: ``counter -= Counter(...)`` rebuilds the whole counter, O(agents) per closed tunnel.
        _decrement(self._per_agent, agent_id)
        _decrement(self._per_connection, peer)

    async def _descriptor(self, context: ConnectContext) -> Any:
        # The first message, or DEADLINE_EXCEEDED after DESCRIPTOR_TIMEOUT_S when no other tunnel waits, after
        # DESCRIPTOR_MAX_TIMEOUT_S in any case (DescriptorWaits).
        self._waits.start()
        loop = asyncio.get_running_loop()
        began = loop.time()
        reading = asyncio.ensure_future(context.read())
        try:
            done, _ = await asyncio.wait((reading,), timeout=DESCRIPTOR_TIMEOUT_S)
            while not done:
                waited_s = loop.time() - began
                if self._waits.alone() or waited_s >= DESCRIPTOR_MAX_TIMEOUT_S:
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no descriptor within {waited_s:.0f} s of opening the tunnel",
                    )
                done, _ = await asyncio.wait((reading,), timeout=1.0)
        finally:
            self._waits.stop()
            if not reading.done():
                reading.cancel()
        return reading.result()

    async def _serve(self, agent_id: int, context: ConnectContext) -> None:
        first: Any = await self._descriptor(context)
        if first is grpc.aio.EOF:
            return
        try:
            if StreamAutomaton(rpc_pb2.ConnectRequest).visit(first) != "descriptor":
                raise StreamOrderError("first message must be descriptor")
        except StreamOrderError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid tunnel stream: {exc}")
        if not first.descriptor.agent_descriptor.services:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "descriptor advertises no services")
        descriptor = first.descriptor.agent_descriptor
        services = len(descriptor.services)
        del first
        age_s = self._max_age_s * random.uniform(0.95, 1.0)
        # Counted once the descriptor is read: a refusal then reaches agentk as its status, not as a failed write.
        peer = context.peer()
        self._take(agent_id, peer)
        try:
            log.debug("tunnel opened", extra={"services": services})
            accepting = self._tunnels.accept_tunnel(agent_id, descriptor, context, current_connection_id(), age_s)
            # This frame lives as long as the tunnel: the parsed message (held by its descriptor) would too.
            del descriptor
            status = await accepting
            log.debug("tunnel closed", extra={"code": "OK" if status is None else status[0].name})
        finally:
            self._release(agent_id, peer)
        if status is not None and status[0] is not grpc.StatusCode.OK:
            await context.abort(status[0], status[1])


def _decrement(counter: Counter[Any], key: Any) -> None:
    """Count one fewer for ``key``, dropping it at zero so the counter holds only live agents/connections."""
    if counter[key] <= 1:
        counter.pop(key, None)
    else:
        counter[key] -= 1


class ReverseTunnelServerFactory:
    """kas half of ``reverse_tunnel``: ``Connect`` on the agent listener, feeding ``api.tunnel_handler``."""

    name = "reverse_tunnel"

    def new(self, api: ServerApi) -> Module:
        """Register ``ReverseTunnel`` on the agent listener."""
        rpc_pb2_grpc.add_ReverseTunnelServicer_to_server(
            ReverseTunnelServicer(
                api.tunnel_handler,
                api.auth,
                api.long_poll_age_s,
                api.config.agent.listen.max_tunnels_per_agent,
                api.config.agent.listen.max_tunnels_per_connection,
            ),
            api.agent_server,
        )
        return IdleModule(self.name)
