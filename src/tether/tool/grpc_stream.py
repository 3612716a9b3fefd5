"""Writing to client-side gRPC streams without racing their end (issue 9: ``Failed "execute_batch"``).

grpcio's ``StreamStreamCall.write`` turns a write that fails because the peer already ended the call into
the call's *status*: ``INTERNAL: Internal error from Core`` with ``Failed "execute_batch"`` replaces the real
one (``grpc/aio/_call.py``, ``_write`` calls ``set_internal_error``), and every later ``read`` raises it. A
server is free to finish before it has read every request (agentk's internal server answering a GET before
kas' ``close_send`` arrives, a gateway ending its call), so a relay that keeps writing turned a successful
call into a failed one. Two writes in flight on one call fail the same way (one send op at a time in Core).

:class:`CallWriter` serializes the writes of one call and sends through the call's Core object directly, so
a write after the end reports ``False`` and the call keeps the status its peer sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpc import aio
from grpc._cython import cygrpc  # type: ignore[attr-defined]

__all__ = ["BOUNDED_WINDOW_OPTIONS", "PENDING_RPC_OPTIONS", "CallWriter"]

#: Channel and server arguments that bound what gRPC Core receives ahead of the reader. With BDP probing
#: (the default) the HTTP/2 window of a fast loopback stream grows to tens of MiB, which a relay whose client
#: stopped reading then holds in memory; a fixed 1 MiB stream window keeps each hop's share small while
#: leaving enough in flight for full speed on a low-latency link (issue 9 item 2).
BOUNDED_WINDOW_OPTIONS: list[tuple[str, int]] = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1024 * 1024),
]

#: Server arguments: how many calls may wait in gRPC Core for the Python server to pick them up. Core's defaults
#: (1,000, with random early rejection up to a hard 3,000) cancel calls that arrive faster than the event loop
#: takes them: when 1,000 agents connect together, their tunnels ended ``CANCELLED`` within a second and had to
#: be re-opened (about 2 per agent at 10,000 agents; issue 9). A waiting call costs Core a few KiB.
PENDING_RPC_OPTIONS: list[tuple[str, int]] = [
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 50_000),
]

#: What a write to an ended call raises, by layer: Core's failed batch, the API's own checks.
_ENDED = (cygrpc.InternalError, aio.AioRpcError, aio.UsageError, asyncio.InvalidStateError)


class CallWriter:
    """The one writer of a client-side stream call (``StreamStreamCall`` or ``StreamUnaryCall``).

    Args:
        call: the call; its messages must already be bytes (raw-bytes calls, or serialize first).
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        # The Core call: bypasses the API layer that rewrites the status on a failed write (module docstring).
        self._core: Any = getattr(call, "_cython_call", None)
        self._lock = asyncio.Lock()
        self._half_closed = False

    @property
    def half_closed(self) -> bool:
        """Whether :meth:`done_writing` was called."""
        return self._half_closed

    async def write(self, data: bytes) -> bool:
        """Send one message; False (and nothing sent) when the call has ended or was half-closed.

        Raises:
            asyncio.CancelledError: cancelled while sending; the call is cancelled too, as grpcio does, since
                Core still holds the send.
        """
        async with self._lock:
            if self._half_closed or self._call.done():
                return False
            try:
                if self._core is None:
                    await self._call.write(data)
                else:
                    await self._call.wait_for_connection()
                    await self._core.send_serialized_message(data)
            except _ENDED:
                return False
            except asyncio.CancelledError:
                self._call.cancel()
                raise
            return True

    async def done_writing(self) -> None:
        """Half-close the call (idempotent); nothing happens when it has already ended."""
        async with self._lock:
            if self._half_closed:
                return
            self._half_closed = True
            if self._call.done():
                return
            try:
                if self._core is None:
                    await self._call.done_writing()
                else:
                    await self._call.wait_for_connection()
                    await self._core.send_receive_close()
            except _ENDED:
                pass
            except asyncio.CancelledError:
                self._call.cancel()
                raise
