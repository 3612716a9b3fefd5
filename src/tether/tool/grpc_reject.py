"""Refusing a gRPC call from a server interceptor, before its method is looked up or its request read.

An interceptor that refuses a call (bad JWT, unknown agent token, rate limit) returns :func:`reject_handler`'s
handler instead of the method's. Such a call's method name is whatever the caller sent: :func:`is_rejection`
lets later code (the in-flight gauge) treat it as such.
"""

from __future__ import annotations

from typing import Any

import grpc

__all__ = ["is_rejection", "reject_handler"]


def reject_handler(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A method handler ending any call with ``code``/``message`` before reading or decoding a request."""

    async def abort(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, message)

    # On the wire every call is a stream, so a stream handler answers unary callers too, before any read.
    return grpc.stream_stream_rpc_method_handler(abort)


#: The code every :func:`reject_handler` runs (each call gets its own closure of it).
_REJECTION_CODE = reject_handler(grpc.StatusCode.UNKNOWN, "").stream_stream.__code__  # type: ignore[union-attr]


def is_rejection(handler: grpc.RpcMethodHandler[Any, Any]) -> bool:
    """Whether ``handler`` came from :func:`reject_handler`.

    Such a call was refused before its method was looked up, so its method name is the caller's word only
    (issue 28's review: never a metric label).
    """
    return getattr(handler.stream_stream, "__code__", None) is _REJECTION_CODE
