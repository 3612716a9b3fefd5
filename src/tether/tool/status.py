"""One error type for gRPC-shaped failures, and the one place that maps a status to HTTP and WebSocket.

Every failure that ends as a gRPC status somewhere (routing, gateway, agent authentication, agentk's
``MakeRequest``, the Graph API stream) is a :class:`StatusError`: a ``grpc.StatusCode`` and a message.
Where it leaves the process:
- as a gRPC status: :meth:`StatusError.abort` on a servicer context, or :meth:`StatusError.to_proto`;
- as HTTP (the Kubernetes API proxy answers with ``Status`` JSON carrying this code): :func:`http_code`;
- as a WebSocket close (the Graph API): :func:`websocket_close_code`.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
from google.rpc import status_pb2

from tether.tool.grpc_meta import status_to_proto

#: gRPC code -> HTTP code for failures relayed to HTTP clients; anything else is a 502 (the upstream
#: proxy's answer for a failing agent or tunnel, kas.md §5.3).
_HTTP_CODES: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

#: gRPC code -> WebSocket close code (RFC 6455 §7.4.1); anything else is 1011 (internal error).
_WEBSOCKET_CODES: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 1007,
    grpc.StatusCode.PERMISSION_DENIED: 1008,
    grpc.StatusCode.UNAUTHENTICATED: 1008,
    grpc.StatusCode.UNAVAILABLE: 1013,
    grpc.StatusCode.DEADLINE_EXCEEDED: 1013,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 1013,
    grpc.StatusCode.CANCELLED: 1001,
}


def http_code(code: grpc.StatusCode) -> int:
    """The HTTP status code for a failure with gRPC status ``code`` (400, 401, 403, 504, else 502)."""
    return _HTTP_CODES.get(code, 502)


def websocket_close_code(code: grpc.StatusCode) -> int:
    """The WebSocket close code for a failure with gRPC status ``code`` (1007, 1008, 1013, 1001, else 1011)."""
    return _WEBSOCKET_CODES.get(code, 1011)


class StatusError(Exception):
    """A failure with a gRPC status: ``code`` and ``message`` are what the caller is told.

    Subclasses only name where the failure arose (``RoutingError``, ``AuthError``...), so handlers can
    catch the ones they handle; they add no fields.

    Args:
        code: the gRPC status code.
        message: the status message (never a secret: it reaches the caller).
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def to_proto(self) -> status_pb2.Status:
        """This failure as a ``google.rpc.Status``."""
        return status_to_proto(self.code, self.message)

    @property
    def http_code(self) -> int:
        """See :func:`http_code`."""
        return http_code(self.code)

    @property
    def websocket_close_code(self) -> int:
        """See :func:`websocket_close_code`."""
        return websocket_close_code(self.code)

    async def abort(self, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        """End the RPC served through ``context`` with this status."""
        await context.abort(self.code, self.message)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover
