"""gRPC glue for routing: the private API catch-all (gateway role) and routed methods on the api listener.

Both use raw-bytes stream handlers (no (de)serializers), the grpcio equivalent of upstream's raw codec
(kas.md §1.7): frames of the routed call are never decoded. Unary methods are served as streams, which is
the same on the wire (kas.md §2.2).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc
from google.rpc import status_pb2

from tether.modserver.agent_conn import AgentIdFromRequest
from tether.modserver.audit import AuditRecord, AuditSink
from tether.pb.gitlab.agent.kas import kasapp_pb2
from tether.tool.grpc_meta import STATUS_DETAILS_KEY, Metadata, code_from_int, values_to_meta
from tether.tool.logs import REQUEST_ID_METADATA, bind, new_request_id
from tether.tunnel.server.gateway import Gateway, GatewayError
from tether.tunnel.server.metadata import ROUTING_AGENT_ID_KEY, routing_agent_id
from tether.tunnel.server.router import Router, RoutingError
from tether.tunnel.server.tunnel import ValuesMap

log = logging.getLogger(__name__)
RawContext = grpc.aio.ServicerContext[bytes, bytes]


class _ContextPeer:
    """The routing kas as seen through the private API call's servicer context."""

    def __init__(self, context: RawContext) -> None:
        self._context = context

    async def read(self) -> bytes | None:
        data: Any = await self._context.read()
        return None if data is grpc.aio.EOF else data

    async def write(self, response: kasapp_pb2.GatewayKasResponse) -> None:
        await self._context.write(response.SerializeToString())


class PrivateApiHandler(grpc.GenericRpcHandler):
    """Serves every method on the private API by following ``kas-hop-routing-agent-id`` to a tunnel."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Return a raw stream handler for any method name."""
        full_method = handler_call_details.method

        async def handle(_requests: Any, context: RawContext) -> None:
            try:
                await self._gateway.serve(full_method, context.invocation_metadata(), _ContextPeer(context))
            except GatewayError as exc:
                await exc.abort(context)

        return grpc.stream_stream_rpc_method_handler(handle)


class ServicerCaller:
    """The original call on a kas listener, as a :class:`~tether.tunnel.server.router.CallerSide`.

    Args:
        context: the servicer context of a raw-bytes stream handler.
        first: request messages already read (e.g. to find the agent id), replayed before the rest.
    """

    def __init__(self, context: RawContext, first: list[bytes] | None = None) -> None:
        self._context = context
        self._pending = list(first or [])
        self._eof = False
        self.trailer: Metadata = ()
        #: Raw message bytes from the caller and to it (an audit record's byte counter).
        self.bytes_in = sum(len(message) for message in self._pending)
        self.bytes_out = 0
        self.status_sent = 0  # the call's status is known at its end only

    async def read(self) -> bytes | None:
        """Next raw request message, or None after the caller's half-close."""
        if self._pending:
            return self._pending.pop(0)
        if self._eof:
            return None
        data: Any = await self._context.read()
        if data is grpc.aio.EOF:
            self._eof = True
            return None
        self.bytes_in += len(data)
        return bytes(data)

    async def send_header(self, meta: ValuesMap) -> None:
        """Send agentk's headers as this call's initial metadata."""
        await self._context.send_initial_metadata(values_to_meta(meta))

    async def write(self, data: bytes) -> None:
        """Send one raw response message."""
        self.bytes_out += len(data)
        await self._context.write(data)

    async def set_trailer(self, meta: ValuesMap) -> None:
        """Keep agentk's trailers for the end of the call."""
        self.trailer = values_to_meta(meta)
        self._context.set_trailing_metadata(self.trailer)

    async def finish(self, status: status_pb2.Status | None) -> None:
        """End the call with agentk's status (details travel in ``grpc-status-details-bin``)."""
        if status is None or status.code == 0:
            return
        trailer = self.trailer
        if status.details:
            trailer = (*trailer, (STATUS_DETAILS_KEY, status.SerializeToString()))
        await self._context.abort(code_from_int(status.code), status.message, trailer)


class RoutedApiHandler(grpc.GenericRpcHandler):
    """Routes calls on a kas listener to agents (seed 001 "High level schema").

    Methods in ``methods`` name their agent in the request message (e.g. ``GetPodsRequest.agent_id``).
    Any other method is routed when the caller names the agent in ``kas-hop-routing-agent-id`` metadata,
    so the hub can call every agent API as if agentk were a plain gRPC server (a Tether addition; upstream
    reaches that generic entry point only from inside kas).

    Every routed call is recorded in ``audit`` (kind "grpc", the method as verb, the gRPC status code number).

    Args:
        router: the routing kas.
        methods: full method name to a function that reads the agent id from the first request message.
        audit: where routed calls are recorded (``ServerApi.audit``).
    """

    def __init__(
        self, router: Router, methods: Mapping[str, AgentIdFromRequest], audit: AuditSink | None = None
    ) -> None:
        self._router = router
        self._methods = dict(methods)
        self._audit = audit if audit is not None else AuditSink()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Return a raw stream handler for the configured methods, None for others."""
        full_method = handler_call_details.method
        agent_id_of = self._methods.get(full_method)
        metadata = handler_call_details.invocation_metadata or ()
        if agent_id_of is None and not any(k == ROUTING_AGENT_ID_KEY for k, _ in metadata):
            return None

        async def handle(_requests: Any, context: RawContext) -> None:
            metadata: Metadata = tuple(context.invocation_metadata() or ())
            request_id = next((str(v) for k, v in metadata if k == REQUEST_ID_METADATA), None)
            if request_id is None:
                request_id = new_request_id()
                metadata = (*metadata, (REQUEST_ID_METADATA, request_id))
            audit = self._audit.begin("grpc", full_method, full_method, request_id, context.peer() or "")
            code = grpc.StatusCode.UNKNOWN.value[0]
            try:
                code = await self._handle(full_method, agent_id_of, metadata, request_id, context, audit)
            finally:
                audit.finish(code)

        return grpc.stream_stream_rpc_method_handler(handle)

    async def _handle(
        self,
        full_method: str,
        agent_id_of: AgentIdFromRequest | None,
        metadata: Metadata,
        request_id: str,
        context: RawContext,
        audit: AuditRecord,
    ) -> int:
        """Route one call; return the gRPC status code number it ends with (the call is aborted on failure)."""
        first: list[bytes] = []
        try:
            if agent_id_of is None:
                agent_id = routing_agent_id(metadata)
            else:
                message: Any = await context.read()
                if message is grpc.aio.EOF:
                    raise ValueError("request message expected")
                first.append(message)
                agent_id = agent_id_of(message)
        except ValueError as exc:
            audit.finish(grpc.StatusCode.INVALID_ARGUMENT.value[0])
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        audit.agent_id = agent_id
        caller = ServicerCaller(context, first)
        audit.counter = caller
        with bind(request_id=request_id, agent_id=agent_id):
            try:
                status = await self._router.route(agent_id, full_method, metadata, caller, context.time_remaining())
            except RoutingError as exc:
                audit.finish(exc.code.value[0])
                await exc.abort(context)
            code = status.code if status is not None else 0
            audit.finish(code)
            await caller.finish(status)
            return code
