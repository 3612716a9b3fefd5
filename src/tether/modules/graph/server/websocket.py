"""kas half of the Graph API: one WebSocket session on ``/graph`` (seed 002 "Client request", issue 6 item 1).

The ``graph`` module mounts it on the Kubernetes API proxy listener, behind its authentication
(``server/__init__.py``)::

    return await serve_graph_websocket(request, agent_opener(api.agent_conn, agent_id, metadata), impersonation)

(``channel_opener(channel)`` does the same over a plain gRPC channel, e.g. to agentk's internal server.)

Session:

1. The request must be a WebSocket upgrade offering the subprotocol ``gitlab-agent-graph-api``
   (otherwise HTTP 400, or close 1002 when the upgrade happened without the subprotocol).
2. The first message must be text (binary -> 1003) holding the request JSON, validated with the same
   validator agentk uses (invalid -> 1007 with the field-naming reason).
3. ``WatchGraph`` is opened on the agent through ``open_watch_graph`` with the caller's identity
   (``impersonation``, for ``access_as: user``); every response becomes one text message
   ``{"actions": [...], "warnings": [...]}``. An agent that does not confirm it applied that identity
   (header ``tether-graph-identity``) gets no response relayed and the session closes with 1008: its graph
   would show what the agent can see instead of what the caller may see (issue 9 item 1).
4. Any further client message closes the session with 1008 ("No more messages are expected").
5. Errors close with an RFC 6455 code and reason; when the reason does not fit the 123-byte close frame,
   ``{"error": {"code", "code_string", "reason"}}`` is sent first and the frame carries it truncated.

Close codes: 1000 the agent ended the stream; 1001 kas is shutting down; 1002 subprotocol missing; 1003
binary request; 1007 invalid request; 1008 a second message, or permission denied by the agent; 1009
request too large (aiohttp); 1011 agent without the Graph API ("update the agent") or an internal error;
1013 the agent is unreachable or timed out (try again later).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import grpc
import structlog
from aiohttp import WSMessage, WSMsgType, web
from grpc import aio

from tether.modserver.agent_conn import AgentCallError, AgentConn, AgentMethod
from tether.modserver.audit import REQUEST_KEY, AuditRecord
from tether.modules.graph.rpc.methods import (
    IDENTITY_HEADER,
    IDENTITY_IMPERSONATED,
    WATCH_GRAPH_FULL_METHOD,
    WATCH_GRAPH_METHOD,
    WATCH_GRAPH_SERVICE,
)
from tether.pb.gitlab.agent.graph.rpc import rpc_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2 as kubernetes_api_pb2
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.tool.status import StatusError, websocket_close_code
from tether.tool.tasks import cancel_and_wait

__all__ = [
    "CLOSE_CODE_NAMES",
    "GRAPH_SUBPROTOCOL",
    "WATCH_GRAPH",
    "GraphStreamError",
    "OpenWatchGraph",
    "WatchGraphUnsupportedError",
    "agent_opener",
    "agent_supports_watch_graph",
    "channel_opener",
    "serve_graph_websocket",
]

_log = structlog.get_logger(__name__)

GRAPH_SUBPROTOCOL = "gitlab-agent-graph-api"

#: RFC 6455 close codes with the names ``error.code_string`` uses (as the Go client library names them).
CLOSE_CODE_NAMES = {
    1000: "StatusNormalClosure",
    1001: "StatusGoingAway",
    1002: "StatusProtocolError",
    1003: "StatusUnsupportedData",
    1007: "StatusInvalidFramePayloadData",
    1008: "StatusPolicyViolation",
    1009: "StatusMessageTooBig",
    1011: "StatusInternalError",
    1012: "StatusServiceRestart",
    1013: "StatusTryAgainLater",
    1014: "StatusBadGateway",
}
#: Largest close-frame reason in bytes (125-byte control frame payload minus the 2-byte code).
MAX_CLOSE_REASON_BYTES = 123

IDENTITY_NOT_APPLIED_REASON = (
    "The agent did not confirm that it computes the graph with your identity (access_as: user); "
    "update the agent to a version that supports it."
)

UNSUPPORTED_REASON = (
    "The agent does not support the Graph API (no WatchGraph RPC). Update the agent to a version that supports it."
)

#: Opens ``WatchGraph`` on the session's agent and yields its responses. It raises
#: :class:`WatchGraphUnsupportedError` when the agent does not advertise the method, and
#: ``grpc.aio.AioRpcError`` (or :class:`GraphStreamError`) for other failures; stopping the iteration
#: (``aclose``, task cancellation) must cancel the RPC.
OpenWatchGraph = Callable[[rpc_pb2.WatchGraphRequest], AsyncIterator[rpc_pb2.WatchGraphResponse]]


class WatchGraphUnsupportedError(Exception):
    """The agent does not serve ``WatchGraph`` (an older agent)."""


class GraphStreamError(StatusError):
    """A failure of the routed stream with its gRPC status code (for openers that do not use grpc.aio)."""


def agent_supports_watch_graph(descriptor: info_pb2.AgentDescriptor) -> bool:
    """Whether a tunnel's ``AgentDescriptor`` advertises ``KubernetesApi/WatchGraph``."""
    return any(
        service.name == WATCH_GRAPH_SERVICE and any(m.name == WATCH_GRAPH_METHOD for m in service.methods)
        for service in descriptor.services
    )


def channel_opener(channel: aio.Channel, metadata: Sequence[tuple[str, str]] | None = None) -> OpenWatchGraph:
    """An :data:`OpenWatchGraph` calling ``WatchGraph`` over a gRPC channel (to agentk or a routing proxy).

    Args:
        channel: a channel whose calls reach the agent.
        metadata: call metadata (e.g. routing headers naming the agent).
    """
    method = channel.unary_stream(
        WATCH_GRAPH_FULL_METHOD,
        request_serializer=rpc_pb2.WatchGraphRequest.SerializeToString,
        response_deserializer=rpc_pb2.WatchGraphResponse.FromString,
    )

    async def open_stream(request: rpc_pb2.WatchGraphRequest) -> AsyncIterator[rpc_pb2.WatchGraphResponse]:
        call = method(request, metadata=tuple(metadata or ()))
        try:
            if request.HasField("impersonation"):
                header = await call.initial_metadata()
                _check_identity(request, [str(v) for k, v in (header or ()) if k == IDENTITY_HEADER])
            async for response in call:
                yield response
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise WatchGraphUnsupportedError(UNSUPPORTED_REASON) from exc
            raise
        finally:
            call.cancel()

    return open_stream


#: ``WatchGraph`` as an agent method of the seam.
WATCH_GRAPH = AgentMethod(WATCH_GRAPH_FULL_METHOD, rpc_pb2.WatchGraphRequest, rpc_pb2.WatchGraphResponse)


def agent_opener(agents: AgentConn, agent_id: int, metadata: Sequence[tuple[str, str]] = ()) -> OpenWatchGraph:
    """An :data:`OpenWatchGraph` that calls ``WatchGraph`` on agent ``agent_id`` through kas' agent connection.

    Only tunnels whose agent advertises ``KubernetesApi/WatchGraph`` carry the call; when none shows up within
    the find timeout (an agent that is offline or too old), the session closes with 1011 and asks to update the
    agent. Responses come through the call's small bounded buffer, so a slow WebSocket client slows the tunnel
    down (and the agent coalesces changes) instead of buffering in kas.

    Args:
        agents: kas' agent connection (``ServerApi.agent_conn``).
        agent_id: the authenticated agent.
        metadata: extra call metadata.
    """

    async def open_stream(request: rpc_pb2.WatchGraphRequest) -> AsyncIterator[rpc_pb2.WatchGraphResponse]:
        async def one() -> AsyncIterator[rpc_pb2.WatchGraphRequest]:
            yield request

        call = agents.call(agent_id, WATCH_GRAPH, one(), metadata=tuple(metadata))
        try:
            async for response in call:
                header = await call.initial_metadata()
                _check_identity(request, [str(v) for k, v in header if k == IDENTITY_HEADER])
                yield response
        except AgentCallError as exc:
            if exc.routing and exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise WatchGraphUnsupportedError(f"{exc.message} {UNSUPPORTED_REASON}") from exc
            if not exc.routing and exc.code == grpc.StatusCode.UNIMPLEMENTED:
                raise WatchGraphUnsupportedError(UNSUPPORTED_REASON) from exc
            raise GraphStreamError(exc.code, exc.message) from exc
        finally:
            # The call ends with the stream, however it ends (the client left, a second message, kas stopping).
            call.cancel()

    return open_stream


def _check_identity(request: rpc_pb2.WatchGraphRequest, confirmed: Sequence[str]) -> None:
    """Refuse a stream whose agent did not confirm that it applied the request's impersonation."""
    if request.HasField("impersonation") and IDENTITY_IMPERSONATED not in confirmed:
        raise GraphStreamError(grpc.StatusCode.PERMISSION_DENIED, IDENTITY_NOT_APPLIED_REASON)


async def serve_graph_websocket(
    request: web.BaseRequest,
    open_watch_graph: OpenWatchGraph,
    impersonation: kubernetes_api_pb2.ImpersonationConfig | None,
    *,
    first_message_timeout_s: float = 10.0,
    heartbeat_s: float = 30.0,
) -> web.StreamResponse:
    """Serve one Graph API WebSocket session (the caller has authenticated the request and picked the agent).

    Args:
        request: the HTTP request on ``/graph`` (a ``web.Request`` or the low-level ``web.BaseRequest``).
        open_watch_graph: opens ``WatchGraph`` on the agent, see :data:`OpenWatchGraph`.
        impersonation: the caller's identity for ``access_as: user`` (the graph is computed as this
            identity), or None for the agent's own identity (``access_as: agent``).
        first_message_timeout_s: seconds to wait for the request message before closing (1008).
        heartbeat_s: seconds between WebSocket pings.

    Returns:
        The WebSocket response (closed), or an HTTP 400 response when the request is not a Graph API upgrade.
    """
    # The request parser (with CEL) and the wire format load with the first graph, not with kas.
    from tether.modules.graph.engine.request import MAX_REQUEST_BYTES  # noqa: PLC0415

    ws = web.WebSocketResponse(protocols=[GRAPH_SUBPROTOCOL], heartbeat=heartbeat_s, max_msg_size=MAX_REQUEST_BYTES)
    if not ws.can_prepare(request).ok:
        return web.Response(status=400, text=f"expected a WebSocket upgrade with the {GRAPH_SUBPROTOCOL} subprotocol\n")
    await ws.prepare(request)
    traffic = _Traffic()
    record = request.get(REQUEST_KEY)
    if isinstance(record, AuditRecord):
        # The session is audited as switched (101) even if the client leaves while it winds down (then no
        # response is returned to the proxy, which would record the client as gone before any answer).
        record.head_status = 101
        record.counter = traffic
    try:
        await _session(ws, open_watch_graph, impersonation, first_message_timeout_s, traffic)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await asyncio.shield(_close(ws, 1001, "server is shutting down"))
        raise
    return ws


class _Traffic:
    """The session's bytes for its audit event (``ByteCounter``): the data messages' payloads, each way."""

    __slots__ = ("bytes_in", "bytes_out", "status_sent")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.status_sent = 101

    def received(self, message: WSMessage) -> None:
        data = message.data
        self.bytes_in += len(data.encode()) if isinstance(data, str) else len(data)


async def _session(
    ws: web.WebSocketResponse,
    open_watch_graph: OpenWatchGraph,
    impersonation: kubernetes_api_pb2.ImpersonationConfig | None,
    first_message_timeout_s: float,
    traffic: _Traffic,
) -> None:
    from tether.modules.graph.engine.request import RequestError, parse_request  # noqa: PLC0415
    from tether.modules.graph.rpc.wire import request_to_proto  # noqa: PLC0415

    if ws.ws_protocol != GRAPH_SUBPROTOCOL:
        await _close(ws, 1002, f"the WebSocket subprotocol must be {GRAPH_SUBPROTOCOL}")
        return
    try:
        first = await ws.receive(timeout=first_message_timeout_s)
    except TimeoutError:
        await _close(ws, 1008, f"no request message received within {first_message_timeout_s:g} seconds")
        return
    if first.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
        return  # the client went away (or aiohttp already closed, e.g. 1009 for a too large message)
    traffic.received(first)
    if first.type != WSMsgType.TEXT:
        await _close(ws, 1003, "the request must be a text message with JSON")
        return
    try:
        parsed = parse_request(first.data)
    except RequestError as exc:
        await _close(ws, 1007, f"invalid request: {exc}")
        return
    reader = asyncio.create_task(_watch_client(ws, traffic), name="graph-ws-reader")
    watch_request = request_to_proto(parsed.source)
    if impersonation is not None:
        watch_request.impersonation.CopyFrom(impersonation)
    relay = asyncio.create_task(_relay(ws, open_watch_graph, watch_request, traffic), name="graph-ws-relay")
    try:
        await asyncio.wait({reader, relay}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(reader, relay)
    client_spoke = reader.done() and not reader.cancelled() and reader.exception() is None and reader.result()
    if client_spoke and (relay.cancelled() or relay.exception() is None):
        await _close(ws, 1008, "unexpected message: the Graph API accepts a single request message")
        return
    if relay.cancelled():
        return  # the client closed the connection
    error = relay.exception()
    if error is None:
        await _close(ws, 1000, "the agent ended the graph stream")
    elif isinstance(error, WatchGraphUnsupportedError):
        await _close(ws, 1011, str(error) or UNSUPPORTED_REASON)
    elif isinstance(error, aio.AioRpcError):
        if error.code() == grpc.StatusCode.UNIMPLEMENTED:
            await _close(ws, 1011, UNSUPPORTED_REASON)
        else:
            await _close(ws, websocket_close_code(error.code()), f"agent: {error.details() or error.code().name}")
    elif isinstance(error, GraphStreamError):
        await _close(ws, error.websocket_close_code, f"agent: {error}")
    else:
        _log.error("graph_ws_relay_failed", error=repr(error))
        await _close(ws, 1011, f"internal error: {error}")


async def _watch_client(ws: web.WebSocketResponse, traffic: _Traffic) -> bool:
    """Return True when the client sends another data message, False when it closes."""
    while True:
        message = await ws.receive()
        if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
            traffic.received(message)
            return True
        if message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return False


async def _relay(
    ws: web.WebSocketResponse, open_watch_graph: OpenWatchGraph, request: rpc_pb2.WatchGraphRequest, traffic: _Traffic
) -> None:
    from tether.modules.graph.rpc.wire import response_to_json  # noqa: PLC0415

    stream = open_watch_graph(request)
    try:
        async for response in stream:
            if not response.actions and not response.warnings:
                continue
            message = response_to_json(response)
            await ws.send_frame(message, WSMsgType.TEXT)
            traffic.bytes_out += len(message)
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


async def _close(ws: web.WebSocketResponse, code: int, reason: str) -> None:
    """Close with ``code``; a reason longer than the close frame allows is also sent as an ``error`` message."""
    from tether.modules.graph.rpc.wire import error_to_json  # noqa: PLC0415

    if ws.closed:
        return
    encoded = reason.encode()
    if len(encoded) > MAX_CLOSE_REASON_BYTES:
        with contextlib.suppress(Exception):
            await ws.send_frame(error_to_json(code, CLOSE_CODE_NAMES.get(code, str(code)), reason), WSMsgType.TEXT)
        encoded = encoded[:MAX_CLOSE_REASON_BYTES].decode("utf-8", "ignore").encode()
    with contextlib.suppress(Exception):
        await ws.close(code=code, message=encoded)
