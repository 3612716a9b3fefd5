"""Serving a tunnelled call in-process: kas' frames go straight to the module's registered gRPC handler.

Upstream agentk replays each tunnelled call on its internal gRPC server over an in-memory connection
(kas.md §0.1). grpcio has no in-process transport, and a replay over a unix socket crossed gRPC twice more
per call: each message a thread hand-off in grpcio's asyncio integration, about 45 % of a small request's
time in agentk (docs/benchmarks.md, "Hot path", issue 28). :class:`LocalCall` runs the same
``grpc.RpcMethodHandler`` the internal server holds, with a :class:`LocalContext` in place of grpcio's, so
modules keep their handler contract and the bytes are decoded once.

What grpcio's server does and this keeps: request and response (de)serializers, initial metadata sent before
the first message, ``abort``/``set_code``/trailing metadata, ``UNKNOWN`` for an exception escaping the
handler, ``DEADLINE_EXCEEDED`` at kas' deadline (``tether-timeout-ms``), the request id bound to the
handler's log lines and its trace context, and flow control: a request message is handed over only when the
handler reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NoReturn, Protocol

import grpc
import structlog
from grpc import aio

from tether.tool import tracing
from tether.tool.grpc_meta import Metadata, timeout_from
from tether.tool.logs import REQUEST_ID_METADATA

__all__ = ["CallSink", "LocalCall", "LocalContext", "SinkClosed"]

_log = structlog.get_logger(__name__)

#: What grpcio's ``ServicerContext`` methods take as metadata.
_MetadataArg = aio.Metadata | Sequence[tuple[str, str | bytes]]

_End = object()  # the request stream's end in the request queue


class SinkClosed(Exception):
    """The tunnel ended while the call still answered (kas' caller went away); raised by a :class:`CallSink`."""


class CallSink(Protocol):
    """Where a local call's answer goes: the tunnel's ``header``/``message``/``trailer``/``error`` frames.

    Each method raises :class:`SinkClosed` once the tunnel has ended.
    """

    async def header(self, metadata: Metadata) -> None:
        """Send the response's initial metadata (once, before any message)."""

    async def message(self, data: bytes) -> None:
        """Send one serialized response message."""

    async def end(self, code: grpc.StatusCode, details: str, trailers: Metadata) -> None:
        """Send the trailing metadata and the status; the last thing sent."""


class _Aborted(Exception):
    """Raised by :meth:`LocalContext.abort` (grpcio raises its ``AbortError`` the same way)."""


class LocalContext(aio.ServicerContext[Any, Any]):
    """The ``ServicerContext`` a handler sees when its call arrives through a tunnel.

    Args:
        metadata: the call's metadata as kas forwarded it.
        requests: the request queue the tunnel fills (decoded messages, then the end marker).
        sink: where headers and messages go.
        serialize: the handler's response serializer (None: messages are bytes already).
    """

    def __init__(
        self,
        metadata: Metadata,
        requests: asyncio.Queue[object],
        sink: CallSink,
        serialize: Callable[[Any], bytes] | None,
    ) -> None:
        self._metadata = metadata
        self._requests = requests
        self._sink = sink
        self._serialize = serialize
        self._header_sent = False
        self._trailers: Metadata = ()
        self.code_set: grpc.StatusCode | None = None
        self.details_set = ""

    async def ensure_header(self) -> None:
        """Send empty initial metadata unless some was sent (gRPC sends it before the first message)."""
        if not self._header_sent:
            await self.send_initial_metadata(())

    @property
    def trailers(self) -> Metadata:
        """The trailing metadata the handler set."""
        return self._trailers

    async def read(self) -> Any:
        """The next request message, or ``aio.EOF`` after the last."""
        item = await self._requests.get()
        if item is _End:
            self._requests.put_nowait(_End)  # every later read sees the end too
            return aio.EOF
        return item

    async def write(self, message: Any) -> None:
        """Send one response message, after the initial metadata."""
        await self.ensure_header()
        await self._sink.message(self._serialize(message) if self._serialize is not None else message)

    async def send_initial_metadata(self, initial_metadata: _MetadataArg) -> None:
        """Send the response's initial metadata; grpcio refuses a second time, and so does this."""
        if self._header_sent:
            raise aio.UsageError("initial metadata was already sent")
        self._header_sent = True
        await self._sink.header(tuple(initial_metadata))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: _MetadataArg = ()) -> NoReturn:
        """End the call with ``code``; raises, like grpcio's, so the handler stops here."""
        self.code_set, self.details_set = code, details
        if trailing_metadata:
            self._trailers = tuple(trailing_metadata)
        raise _Aborted

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        """End the call with ``status`` (code, details, trailing metadata)."""
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_trailing_metadata(self, trailing_metadata: _MetadataArg) -> None:
        """Trailing metadata sent with the status."""
        self._trailers = tuple(trailing_metadata)

    def invocation_metadata(self) -> aio.Metadata:
        """The metadata kas forwarded with the call."""
        return aio.Metadata(*self._metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        """The status the call ends with when the handler returns."""
        self.code_set = code

    def set_details(self, details: str) -> None:
        """The status message the call ends with when the handler returns."""
        self.details_set = details

    def set_compression(self, compression: grpc.Compression) -> None:
        """Nothing to compress: the tunnel's own gRPC stream decides (kept for the handler contract)."""

    def disable_next_message_compression(self) -> None:
        """Nothing to compress (see :meth:`set_compression`)."""

    def peer(self) -> str:
        """The call came through a reverse tunnel from kas, not from a socket of its own."""
        return "tunnel"

    def peer_identities(self) -> None:
        """No transport security of its own (the tunnel's TLS is kas')."""
        return None

    def peer_identity_key(self) -> None:
        """See :meth:`peer_identities`."""
        return None

    def auth_context(self) -> dict[str, list[bytes]]:
        """Empty, as on grpcio's insecure internal server."""
        return {}


class LocalCall:
    """One tunnelled call served by ``handler`` in this process (module docstring).

    Feed it with :meth:`send` and :meth:`close_send`; it answers through ``sink`` and ends with
    :meth:`CallSink.end` unless :meth:`cancel` comes first.

    Args:
        handler: the method's handler as registered on the internal server.
        metadata: the call's metadata (``tether-timeout-ms`` sets the deadline, ``request-id`` the log field).
        sink: the tunnel's side.
    """

    def __init__(self, handler: grpc.RpcMethodHandler[Any, Any], metadata: Metadata, sink: CallSink) -> None:
        self._handler = handler
        self._decode: Callable[[bytes], Any] | None = handler.request_deserializer
        # One message ahead, like the window of a stream: the tunnel stops reading kas' frames until the
        # handler takes it, so kas' side sees back-pressure instead of this queue growing.
        self._requests: asyncio.Queue[object] = asyncio.Queue(maxsize=1)
        self._context = LocalContext(metadata, self._requests, sink, handler.response_serializer)
        self._sink = sink
        self._deadline_s = timeout_from(metadata)
        self._bad_request: str | None = None
        self._started = False
        request_id = next((v for k, v in metadata if k == REQUEST_ID_METADATA and isinstance(v, str)), None)
        self._task = asyncio.create_task(self._serve(request_id))

    async def send(self, data: bytes) -> bool:
        """Hand one request message to the handler; False (dropped) once the call has ended.

        A message that does not decode ends the call ``INTERNAL`` as grpcio's server does.
        """
        if self._task.done():
            return False
        try:
            message = self._decode(data) if self._decode is not None else data
        except Exception as exc:  # any decoding failure is the caller's bad message
            self._bad_request = f"Exception deserializing request: {exc!r}"
            if self._started:  # else _serve sees it when it starts
                self._task.cancel()
            return False
        with contextlib.suppress(asyncio.QueueFull):
            self._requests.put_nowait(message)  # the usual case: the handler is waiting for it
            return True
        put = asyncio.ensure_future(self._requests.put(message))
        await asyncio.wait({put, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            return False
        return True

    async def close_send(self) -> None:
        """The request stream ended (kas ``close_send``)."""
        if not self._task.done():
            put = asyncio.ensure_future(self._requests.put(_End))
            await asyncio.wait({put, self._task}, return_when=asyncio.FIRST_COMPLETED)
            put.cancel()

    def cancel(self) -> None:
        """The tunnel ended first: stop the handler (its client went away)."""
        self._task.cancel()

    async def wait(self) -> None:
        """Return once the call has ended (answered or cancelled)."""
        await asyncio.wait({self._task})

    async def _serve(self, request_id: str | None) -> None:
        if request_id is not None:
            structlog.contextvars.bind_contextvars(request_id=request_id)  # this task's own context
        if (tracer := tracing.TRACER) is not None:
            # The call's trace context is current for the handler: its API server requests are child spans.
            tracer.attach(self._context.invocation_metadata())
        self._started = True
        context = self._context
        try:
            if self._bad_request is not None:
                raise asyncio.CancelledError
            async with asyncio.timeout(self._deadline_s):
                await self._run_handler()
            code, details = context.code_set or grpc.StatusCode.OK, context.details_set
        except SinkClosed:
            return  # nobody is left to answer
        except _Aborted:
            code, details = context.code_set or grpc.StatusCode.UNKNOWN, context.details_set
        except TimeoutError:
            code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except asyncio.CancelledError:
            if self._bad_request is None:
                raise
            code, details = grpc.StatusCode.INTERNAL, self._bad_request
        except Exception as exc:
            # grpcio's words for a handler that raised, so callers see the same status either way.
            code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
            _log.exception("local_call_failed")
        with contextlib.suppress(SinkClosed):
            await context.ensure_header()
            await self._sink.end(code, details, context.trailers)

    async def _run_handler(self) -> None:
        handler, context = self._handler, self._context
        if handler.request_streaming:
            request: Any = self._iterate()
        else:
            request = await context.read()
            if request is aio.EOF:
                await context.abort(grpc.StatusCode.INTERNAL, "the request stream ended without a message")
        if handler.response_streaming:
            method: Any = handler.stream_stream if handler.request_streaming else handler.unary_stream
            result = method(request, context)
            if inspect.isasyncgen(result):  # a handler may yield its messages instead of writing them
                async for message in result:
                    await context.write(message)
            else:
                await result
        else:
            method = handler.stream_unary if handler.request_streaming else handler.unary_unary
            response = await method(request, context)
            if response is not None:
                await context.write(response)

    async def _iterate(self) -> AsyncIterator[Any]:
        while (message := await self._context.read()) is not aio.EOF:
            yield message
