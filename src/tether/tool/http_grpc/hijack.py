"""The client's connection after an HTTP upgrade: raw bytes both ways (kas.md §5.3 step 6).

aiohttp's server relays WebSocket frames but not other upgraded protocols (SPDY/3.1 parses as a new HTTP
request and fails). So once the ``101 Switching Protocols`` head is on the wire, kas takes the transport
over: :func:`hijack` installs a :class:`RawConnection` as the transport's protocol
(``asyncio.Transport.set_protocol``; see ``../shared/reference/stack.md`` §4). The swap happens in the same
event-loop step as the ``101`` write, so no byte the client sends after reading the ``101`` can reach
aiohttp's parser. Upgrade clients wait for the ``101`` before sending; bytes that still arrived earlier
are taken from aiohttp's buffer.
"""

from __future__ import annotations

import asyncio
import collections

from aiohttp import web

__all__ = ["RawConnection", "hijack"]

#: Stop reading from the client while this many received bytes wait to be relayed.
_READ_HIGH_WATER = 256 * 1024
#: Resume reading once the backlog is below this.
_READ_LOW_WATER = 64 * 1024


class RawConnection(asyncio.Protocol):
    """An upgraded client connection: :meth:`read` what the client sends, :meth:`write` to it.

    When the connection is lost, the previous protocol (aiohttp's request handler) is told too, so aiohttp
    forgets the connection and cancels the request's handler.

    Args:
        transport: the client's transport, already taken over.
        previous: aiohttp's protocol that owned the transport until now.
        buffered: bytes the client sent before the takeover.
    """

    def __init__(self, transport: asyncio.Transport, previous: asyncio.BaseProtocol, buffered: bytes = b"") -> None:
        self._transport = transport
        self._previous = previous
        self._chunks: collections.deque[bytes] = collections.deque()
        self._backlog = 0
        self._paused = False
        self._eof = False
        self._lost = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        # A TLS connection cannot stay half-open (asyncio ignores the request and warns).
        self._half_close = transport.get_extra_info("sslcontext") is None
        if buffered:
            self.data_received(buffered)

    def data_received(self, data: bytes) -> None:
        """Queue bytes from the client; pause reading when too much waits."""
        self._chunks.append(data)
        self._backlog += len(data)
        self._readable.set()
        if self._backlog > _READ_HIGH_WATER and not self._paused and not self._lost:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool | None:
        """The client half-closed: :meth:`read` returns None after the queued bytes; keep writing (plain TCP)."""
        self._eof = True
        self._readable.set()
        return True if self._half_close else None

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: end reads, release writers, and tell aiohttp."""
        self._lost = True
        self._eof = True
        self._readable.set()
        self._writable.set()
        self._previous.connection_lost(exc)

    def pause_writing(self) -> None:
        """The transport's write buffer is full: :meth:`write` waits."""
        self._writable.clear()

    def resume_writing(self) -> None:
        """The write buffer drained."""
        self._writable.set()

    async def read(self) -> bytes | None:
        """Next bytes from the client (any size), or None after its EOF or a lost connection."""
        while not self._chunks:
            if self._eof:
                return None
            self._readable.clear()
            await self._readable.wait()
        data = self._chunks.popleft()
        self._backlog -= len(data)
        if self._paused and self._backlog < _READ_LOW_WATER and not self._lost:
            self._paused = False
            self._transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the client, waiting while the transport's buffer is full.

        Raises:
            ConnectionResetError: the connection is lost.
        """
        if self._lost or self._transport.is_closing():
            raise ConnectionResetError("the upgraded client connection is closed")
        self._transport.write(data)
        await self._writable.wait()

    def close(self) -> None:
        """Close the connection after the buffered bytes are sent."""
        self._transport.close()


def hijack(request: web.BaseRequest) -> RawConnection:
    """Take the connection of ``request`` away from aiohttp, right after its ``101`` head was sent.

    Call it with no ``await`` between the head's write (``StreamResponse.prepare``) and this call.

    Raises:
        ConnectionResetError: the client is already gone.
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the client closed the connection before the upgrade")
    previous = request.protocol
    # Bytes that arrived before the takeover wait in aiohttp's upgrade buffer (WebSocket upgrades only).
    early = getattr(previous, "_message_tail", b"")
    raw = RawConnection(transport, previous, early if isinstance(early, bytes) else b"")
    transport.set_protocol(raw)
    if not transport.is_reading():
        transport.resume_reading()
    return raw
