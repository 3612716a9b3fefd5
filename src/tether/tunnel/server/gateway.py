"""The gateway kas role: follow the agent id in the request to a local tunnel (kas.md §2.4, seed 001).

A gateway never does discovery. It answers ``NoTunnel`` while it waits for a tunnel of the agent,
``TunnelReady`` once it has reserved one, and then waits for the routing kas to claim it with
``StartStreaming`` (or to hang up, which returns the tunnel to the registry). It then relays the call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import grpc
from google.rpc import status_pb2

from tether.pb.gitlab.agent.kas import kasapp_pb2
from tether.tool import tracing
from tether.tool.grpc_meta import Metadata, MetadataIn
from tether.tool.logs import bind
from tether.tool.status import StatusError
from tether.tunnel.server.metadata import RoutingMetadataError, forwardable, routing_agent_id, split_method
from tether.tunnel.server.registry import FindHandle, RegistryStopped, TunnelRegistry
from tether.tunnel.server.tunnel import Tunnel, TunnelBroken, ValuesMap

log = logging.getLogger(__name__)
#: The routing kas answers TunnelReady at once (StartStreaming, or hangs up); beyond this it is stalled.
START_STREAMING_TIMEOUT_S = 5.0
Response = kasapp_pb2.GatewayKasResponse


class RoutingPeer(Protocol):
    """The routing kas as the gateway sees it: raw frames in, ``GatewayKasResponse`` out."""

    async def read(self) -> bytes | None:
        """Next frame from the routing kas, or None when it half-closed."""

    async def write(self, response: kasapp_pb2.GatewayKasResponse) -> None:
        """Send one response to the routing kas."""


class GatewayError(StatusError):
    """The request cannot be served; ``code`` and ``message`` become the RPC status."""


class LocalCaller(Protocol):
    """A call of this kas relayed straight onto one of its own tunnels (:meth:`Gateway.forward_reserved`)."""

    async def read(self) -> bytes | None:
        """Next raw request message, or None after the caller's half-close."""

    async def send_header(self, meta: ValuesMap) -> None:
        """Deliver agentk's response headers."""

    async def write(self, data: bytes) -> None:
        """Deliver one raw response message."""

    async def set_trailer(self, meta: ValuesMap) -> None:
        """Deliver agentk's trailers."""


class _Sink:
    """Where agentk's answer goes, remembering how far it got."""

    def __init__(self) -> None:
        self.header_sent = False
        self.trailer_sent = False

    async def header(self, meta: ValuesMap) -> None:
        self.header_sent = True
        await self._header(meta)

    async def trailer(self, meta: ValuesMap) -> None:
        self.trailer_sent = True
        await self._trailer(meta)

    async def message(self, data: bytes) -> None:
        raise NotImplementedError

    async def _header(self, meta: ValuesMap) -> None:
        raise NotImplementedError

    async def _trailer(self, meta: ValuesMap) -> None:
        raise NotImplementedError


class _PeerSink(_Sink):
    """Wraps agentk's answer into ``GatewayKasResponse`` messages for the routing kas."""

    def __init__(self, peer: RoutingPeer) -> None:
        super().__init__()
        self._peer = peer

    async def _header(self, meta: ValuesMap) -> None:
        await self._peer.write(Response(header=Response.Header(meta=meta)))

    async def message(self, data: bytes) -> None:
        await self._peer.write(Response(message=Response.Message(data=data)))

    async def _trailer(self, meta: ValuesMap) -> None:
        await self._peer.write(Response(trailer=Response.Trailer(meta=meta)))


class _CallerSink(_Sink):
    """Hands agentk's answer straight to a call of this kas (no gateway frames)."""

    def __init__(self, caller: LocalCaller) -> None:
        super().__init__()
        self._caller = caller

    async def _header(self, meta: ValuesMap) -> None:
        await self._caller.send_header(meta)

    async def message(self, data: bytes) -> None:
        await self._caller.write(data)

    async def _trailer(self, meta: ValuesMap) -> None:
        await self._caller.set_trailer(meta)


class Gateway:
    """Serves routed calls from tunnels in ``registry``."""

    def __init__(self, registry: TunnelRegistry) -> None:
        self._registry = registry

    async def serve(self, full_method: str, metadata: MetadataIn | None, peer: RoutingPeer) -> None:
        """Serve one routed call end to end.

        Raises:
            GatewayError: INVALID_ARGUMENT for bad routing metadata or a bad first frame,
                UNAVAILABLE when kas is shutting down, DEADLINE_EXCEEDED when the routing kas does not claim the
                reserved tunnel within :data:`START_STREAMING_TIMEOUT_S`.
        """
        try:
            agent_id = routing_agent_id(metadata)
            service, method = split_method(full_method)
            handle = self._registry.find(agent_id, service, method)
        except RoutingMetadataError as exc:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except RegistryStopped as exc:
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        try:
            if not handle.found_now:
                await peer.write(Response(no_tunnel=Response.NoTunnel()))
            try:
                await handle.get()
            except RegistryStopped as exc:
                raise GatewayError(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
            await peer.write(Response(tunnel_ready=Response.TunnelReady()))
            try:
                first = await asyncio.wait_for(peer.read(), START_STREAMING_TIMEOUT_S)
            except TimeoutError:
                # A stalled routing kas must not hold the reserved tunnel: handle.done() gives it back.
                raise GatewayError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the routing kas sent no StartStreaming within {START_STREAMING_TIMEOUT_S:g} s of TunnelReady",
                ) from None
            if first is None:
                return  # the routing kas picked another gateway; handle.done() gives the tunnel back
            try:
                kasapp_pb2.StartStreaming.FromString(first)
            except Exception as exc:
                raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, "expected StartStreaming") from exc
            tunnel = handle.use()
            status = await self._forward(tunnel, full_method, metadata, peer, _PeerSink(peer))
            if status is not None:
                await peer.write(Response(error=Response.Error(status=status)))
        finally:
            handle.done()

    def reserve_now(self, agent_id: int, full_method: str) -> FindHandle | None:
        """An idle tunnel of ``agent_id`` reserved at once, or None (none idle here, or kas is shutting down).

        The routing kas' fast path (issue 28): a call for an agent with an idle tunnel on this very kas skips
        the gateway protocol (``TunnelReady``, ``StartStreaming`` and every answer frame wrapped, queued and
        unwrapped between two tasks) and goes straight onto the tunnel with :meth:`forward_reserved`; the
        tunnel, the metadata agentk sees and the statuses are those of :meth:`serve`. Call ``done()`` on the
        handle afterwards. A malformed method name gets None: :meth:`serve` gives the caller its error.
        """
        try:
            service, method = split_method(full_method)
            handle = self._registry.find(agent_id, service, method)
        except (RoutingMetadataError, RegistryStopped):
            return None
        if handle.found_now:
            return handle
        handle.done()
        return None

    async def forward_reserved(
        self, handle: FindHandle, full_method: str, metadata: MetadataIn | None, caller: LocalCaller
    ) -> status_pb2.Status | None:
        """Relay a call of this kas on the tunnel of :meth:`reserve_now`; agentk's failure status, or None.

        A tunnel that breaks during the call gives ``UNAVAILABLE``, as through :meth:`serve`.
        """
        return await self._forward(handle.use(), full_method, metadata, caller, _CallerSink(caller))

    async def _forward(
        self,
        tunnel: Tunnel,
        full_method: str,
        metadata: MetadataIn | None,
        incoming: LocalCaller | RoutingPeer,
        sink: _Sink,
    ) -> status_pb2.Status | None:
        tracer = tracing.TRACER
        if tracer is None:
            return await self._forward_call(tunnel, full_method, forwardable(metadata), incoming, sink)
        # The gateway kas' hop as a server span, a child of the routing kas' span (issue 25 item 3).
        attributes: dict[str, str | int] = {"rpc.method": full_method, "tether.agent_id": tunnel.agent_id}
        span = tracer.start(f"kas gateway {full_method}", "server", metadata or (), attributes)
        try:
            status = await self._forward_call(
                tunnel, full_method, tracing.with_trace(forwardable(metadata), span.carrier()), incoming, sink
            )
            if status is not None:
                span.grpc_status(status.code, status.message)
            return status
        except asyncio.CancelledError:
            span.set("tether.caller_gone", True)  # the routing kas ended the call: no failure here
            raise
        except BaseException as exc:
            span.fail(repr(exc))
            raise
        finally:
            span.end()

    async def _forward_call(
        self, tunnel: Tunnel, full_method: str, metadata: Metadata, incoming: LocalCaller | RoutingPeer, sink: _Sink
    ) -> status_pb2.Status | None:
        # The call now runs on behalf of the tunnel's agentk connection too (issue 9 item 6).
        with bind(agent_id=tunnel.agent_id, connection_id=tunnel.connection_id):
            try:
                return await tunnel.forward(full_method, metadata, incoming, sink)
            except TunnelBroken as exc:
                log.info("tunnel broke during forwarding: %s", exc.message)
                if sink.header_sent and not sink.trailer_sent:
                    await sink.trailer({})
                return status_pb2.Status(code=exc.code.value[0], message=exc.message)
