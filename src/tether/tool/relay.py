"""The one bounded frame relay: the tunnel, the gateway, the router and the in-memory pipe all move frames with it.

Back-pressure (issue 9 item 2) holds when every hop keeps at most a bounded amount of data in flight and
waits for the next hop before reading more. :func:`dispatch` reads one frame, checks its order against the
stream's automaton and awaits its handler before reading the next; :func:`pump` copies frames one at a time;
:class:`BoundedPipe` joins two tasks of one process with a byte-bounded buffer. A slow reader at the end of a
chain therefore stalls the chain back to its source (gRPC flow control, TCP), instead of growing a buffer.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from google.rpc import status_pb2

from tether.tool.automaton import StreamAutomaton

__all__ = ["DEFAULT_PIPE_BYTES", "AnswerFrames", "BoundedPipe", "Handler", "PipeClosed", "dispatch", "pump"]

M = TypeVar("M", bound=Message)
T = TypeVar("T")

#: Bytes an in-memory pipe holds before its writer waits: a few of the 32 KiB HTTP chunks (kas.md §5.3).
DEFAULT_PIPE_BYTES = 256 * 1024

#: A frame handler; returning True stops :func:`dispatch` at once (the frame ended the relay's job).
Handler = Callable[[M], Awaitable[bool | None]]


async def dispatch(
    read: Callable[[], Awaitable[M | None]], automaton: StreamAutomaton[M], handlers: Mapping[str, Handler[M]]
) -> bool:
    """Relay a message stream frame by frame: read, check the order, await the handler, read the next.

    Args:
        read: returns the next message, or None at the stream's clean end.
        automaton: the stream's order rules (kas.md §1.3, §2.3); kinds are the oneof field names.
        handlers: kind -> coroutine function; kinds without a handler are accepted and dropped.

    Returns:
        True when a handler stopped the relay, False at the stream's end.

    Raises:
        StreamOrderError: a frame out of order, or the stream ended where it may not.
        Exception: whatever ``read`` or a handler raised.
    """
    while (frame := await read()) is not None:
        handler = handlers.get(automaton.visit(frame))
        if handler is not None and await handler(frame):
            return True
    automaton.end()
    return False


class AnswerFrames:
    """Handlers for the answer half of a forwarded call, the same in the tunnel and gateway protocols.

    ``ConnectRequest`` (agentk -> kas) and ``GatewayKasResponse`` (gateway -> routing kas) both carry the answer
    as ``header{meta}``, ``message{data}``*, ``trailer{meta}`` and an optional ``error{status}`` (kas.md §1.3,
    §2.3). The error is kept in :attr:`error` (the peer closes right after it, kas.md §1.7).

    Args:
        header: receives the header's ``meta``.
        message: receives each message's ``data``.
        trailer: receives the trailer's ``meta``.
    """

    def __init__(
        self,
        header: Callable[[Any], Awaitable[object]],
        message: Callable[[bytes], Awaitable[object]],
        trailer: Callable[[Any], Awaitable[object]],
    ) -> None:
        self._header = header
        self._message = message
        self._trailer = trailer
        self.error: status_pb2.Status | None = None

    def handlers(self) -> dict[str, Handler[Any]]:
        """Kind -> handler, for :func:`dispatch`."""

        async def on_header(frame: Any) -> None:
            await self._header(frame.header.meta)

        async def on_message(frame: Any) -> None:
            await self._message(frame.message.data)

        async def on_trailer(frame: Any) -> None:
            await self._trailer(frame.trailer.meta)

        async def on_error(frame: Any) -> None:
            self.error = frame.error.status

        return {"header": on_header, "message": on_message, "trailer": on_trailer, "error": on_error}


async def pump(
    read: Callable[[], Awaitable[T | None]],
    write: Callable[[T], Awaitable[object]],
    close: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Copy frames from ``read`` to ``write`` one at a time until ``read`` returns None, then ``close()``.

    Raises:
        Exception: whatever ``read``, ``write`` or ``close`` raised.
    """
    while (frame := await read()) is not None:
        await write(frame)
    if close is not None:
        await close()


class PipeClosed(Exception):
    """The pipe's reader went away: nothing written any more will be read."""


class BoundedPipe(Generic[T]):
    """A one-direction in-memory pipe that holds at most ``capacity`` bytes (always at least one item).

    The writer waits while the pipe is full; :meth:`close` ends the stream (the reader gets None after the
    queued items) and :meth:`fail` ends it with an exception for the reader. :meth:`abandon` is the reader
    going away: queued items are dropped and a waiting or later writer gets :class:`PipeClosed`.

    Args:
        capacity: bytes buffered before :meth:`put` waits.
        size: the size in bytes of one item (e.g. ``len`` or ``ByteSize``).
    """

    def __init__(self, size: Callable[[T], int], capacity: int = DEFAULT_PIPE_BYTES) -> None:
        self._size = size
        self._capacity = capacity
        self._items: collections.deque[tuple[T, int]] = collections.deque()
        self._bytes = 0
        self._end: BaseException | None = None
        self._ended = False
        self._abandoned = False
        self._changed = asyncio.Event()

    @property
    def buffered_bytes(self) -> int:
        """Bytes queued and not yet read."""
        return self._bytes

    async def put(self, item: T) -> None:
        """Queue ``item``, waiting while the pipe is full.

        Raises:
            PipeClosed: the reader abandoned the pipe.
            RuntimeError: the pipe was already closed by its writer.
        """
        while not self._abandoned and self._items and self._bytes >= self._capacity:
            self._changed.clear()
            await self._changed.wait()
        if self._abandoned:
            raise PipeClosed("the reader went away")
        if self._ended:
            raise RuntimeError("put on a closed pipe")
        size = self._size(item)
        self._items.append((item, size))
        self._bytes += size
        self._changed.set()

    async def get(self) -> T | None:
        """Next item; None after :meth:`close`.

        Raises:
            BaseException: the exception given to :meth:`fail`, once the queued items are read.
        """
        while not self._items:
            if self._ended:
                if self._end is not None:
                    raise self._end
                return None
            self._changed.clear()
            await self._changed.wait()
        item, size = self._items.popleft()
        self._bytes -= size
        self._changed.set()
        return item

    def close(self) -> None:
        """End the stream cleanly after the queued items."""
        self._ended = True
        self._changed.set()

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error`` for the reader, after the queued items."""
        if not self._ended:
            self._end = error
        self.close()

    def abandon(self) -> None:
        """The reader is gone: drop what is queued and refuse further writes."""
        self._abandoned = True
        self._items.clear()
        self._bytes = 0
        self._changed.set()
