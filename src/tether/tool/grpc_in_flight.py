"""``grpc_server_requests_in_flight``: gRPC calls a server is serving now, by method (issue 25 item 4).

Upstream kas' gauge of the same name and labels (``internal/tool/grpctool/stats_handler.go``: namespace
``grpc``, subsystem ``server``, labels ``grpc_method`` and ``grpc_service``), kept by a server interceptor here
(grpcio has no stats handlers). A reverse tunnel counts for as long as it is open, as upstream. A call refused by
an authentication interceptor counts under ``unknown``: its method name is whatever the caller sent (every new name
was a new series kept for kas' lifetime, issue 28's review).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Gauge

from tether.tool.grpc_reject import is_rejection

__all__ = ["SERVER_IN_FLIGHT", "InFlightInterceptor"]

SERVER_IN_FLIGHT = Gauge(
    "grpc_server_requests_in_flight", "Number of requests in flight.", ["grpc_method", "grpc_service"]
)


def _labels(full_method: str) -> tuple[str, str]:
    """(method, service) of ``/package.Service/Method``; ``unknown`` for another shape, as upstream."""
    service, sep, method = full_method.removeprefix("/").rpartition("/")
    if not full_method.startswith("/") or not sep:
        return "unknown", "unknown"
    return method, service


def _counted(behavior: Callable[..., Any], gauge: Any) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            gauge.inc()
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                gauge.dec()

        return stream

    async def call(request: Any, context: Any) -> Any:
        gauge.inc()
        try:
            return await behavior(request, context)
        finally:
            gauge.dec()

    return call


class InFlightInterceptor(grpc.aio.ServerInterceptor):
    """Counts each call in :data:`SERVER_IN_FLIGHT` from its start to its end (put it first in the chain)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The handler with its behaviour wrapped to move the gauge."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        # A refused call's method was never looked up: a stranger's made-up names would each add a series.
        method, service = ("unknown", "unknown") if is_rejection(handler) else _labels(handler_call_details.method)
        gauge = SERVER_IN_FLIGHT.labels(grpc_method=method, grpc_service=service)
        for field in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, field)
            if behavior is not None:
                return handler._replace(**{field: _counted(behavior, gauge)})  # type: ignore[attr-defined, no-any-return]
        return handler
