"""The received-message size limit, checked in Python instead of by gRPC Core's message-size filter.

Why: Core adds its message-size filter to every call of a server that has ``grpc.max_receive_message_length``
or ``grpc.max_send_message_length``, and the filter's per-call state is the largest per-call cost a kas
listener can drop: ``bench/grpc_floor.py`` measured 77.8 KiB per connection of 3 calls with grpcio's defaults,
72.5 with kas' options, and kas with 10,000 agents went from 1,029 to 999 MiB (issue 9,
``kas_rss_10000_agents_mib``; docs/benchmarks.md).
Core reads a whole message before that filter sees its size, so checking after the read bounds memory just
as well. A listener built with :func:`unlimited_size_options` and :class:`MessageSizeInterceptor` answers an
oversize message with the status Core gives: ``RESOURCE_EXHAUSTED`` ``Received message larger than max
(N vs. L)``.

Only asyncio handlers (coroutines and async generators) are supported; kas has no other kind.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


def unlimited_size_options() -> list[tuple[str, int]]:
    """Channel arguments that leave Core's message-size filter out of a server's calls (-1: no limit)."""
    return [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class _Oversize:
    """What the checking deserializer returns in place of a message over the limit."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class _CheckedContext:
    """The servicer context a handler sees: :meth:`read` aborts on an oversize message, the rest delegates."""

    __slots__ = ("_context", "_limit")

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any], limit: int) -> None:
        self._context = context
        self._limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def checked(self, message: Any) -> Any:
        """Return ``message``, or abort the call when it stands for an oversize one."""
        if isinstance(message, _Oversize):
            await self._context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({message.size} vs. {self._limit})",
            )
        return message

    async def read(self) -> Any:
        return await self.checked(await self._context.read())


class _CheckedRequests:
    """A request stream that aborts the call on an oversize message."""

    __slots__ = ("_context", "_requests")

    def __init__(self, requests: AsyncIterable[Any], context: _CheckedContext) -> None:
        self._requests = requests
        self._context = context

    def __aiter__(self) -> _CheckedRequests:
        return self

    async def __anext__(self) -> Any:
        # grpc's receiver makes its generator on first use: a handler that calls context.read() never does.
        return await self._context.checked(await anext(aiter(self._requests)))


def _deserializer(limit: int, parse: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def deserialize(raw: bytes) -> Any:
        if len(raw) > limit:
            return _Oversize(len(raw))
        return raw if parse is None else parse(raw)

    return deserialize


def _behaviour(behaviour: Callable[..., Any], limit: int, request_streaming: bool) -> Callable[..., Any]:
    async def request(message: Any, context: _CheckedContext) -> Any:
        if request_streaming:
            return _CheckedRequests(message, context)
        return await context.checked(message)

    if inspect.isasyncgenfunction(behaviour):

        async def stream(message: Any, raw_context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            context = _CheckedContext(raw_context, limit)
            async for response in behaviour(await request(message, context), context):
                yield response

        return stream
    if not inspect.iscoroutinefunction(behaviour):
        raise TypeError(f"{behaviour!r} is not an asyncio handler")

    async def call(message: Any, raw_context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        context = _CheckedContext(raw_context, limit)
        return await behaviour(await request(message, context), context)

    return call


_FACTORIES = {
    (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
    (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
    (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
    (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
}


def size_checked(handler: grpc.RpcMethodHandler[Any, Any], limit: int) -> grpc.RpcMethodHandler[Any, Any]:
    """Return ``handler`` with every received message limited to ``limit`` bytes (serialized size).

    Raises:
        TypeError: the handler's behaviour is not a coroutine or async generator function.
    """
    factory, attribute = _FACTORIES[(handler.request_streaming, handler.response_streaming)]
    behaviour = _behaviour(getattr(handler, attribute), limit, handler.request_streaming)
    return factory(
        behaviour,
        request_deserializer=_deserializer(limit, handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


#: Methods whose wrapped handler is kept; kas' listeners have a few dozen registered methods.
_MAX_CACHED = 256


class MessageSizeInterceptor(grpc.aio.ServerInterceptor):
    """Limits received messages to ``limit`` bytes on a server built with :func:`unlimited_size_options`.

    A registered method's handler is wrapped once; a generic handler that makes a new handler per call (kas'
    routed and private APIs) gets its handler wrapped per call.

    Args:
        limit: the listener's ``max_message_size`` in bytes.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Return the method's handler with its received messages size-checked."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = size_checked(handler, self._limit)
        if cached is None and len(self._wrapped) < _MAX_CACHED:
            self._wrapped[method] = (handler, wrapped)
        return wrapped
