"""One routing attempt's stream to a gateway: over the private API, or in memory to this kas itself.

The routing kas always tries itself first over an in-memory pipe (kas.md §2.1 "The same instance can be
both"), which runs the very same :class:`~tether.tunnel.server.gateway.Gateway` code as a remote call.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import grpc

from tether.pb.gitlab.agent.kas import kasapp_pb2
from tether.tool.grpc_meta import Metadata
from tether.tool.grpc_stream import CallWriter
from tether.tool.relay import BoundedPipe, PipeClosed
from tether.tool.status import StatusError
from tether.tunnel.server.gateway import Gateway, GatewayError
from tether.tunnel.server.kas_pool import KasPool


class GatewayUnavailable(StatusError):
    """The gateway stream failed; ``code`` tells whether retrying makes sense."""


class GatewayCall(Protocol):
    """The routing kas' end of a stream to one gateway."""

    async def read(self) -> kasapp_pb2.GatewayKasResponse | None:
        """Next response, or None when the gateway ended the stream cleanly.

        Raises:
            GatewayUnavailable: the stream failed.
        """

    async def write(self, data: bytes) -> None:
        """Send ``StartStreaming`` or one raw request frame."""

    async def done_writing(self) -> None:
        """Half-close: the caller sent its last request message."""

    def cancel(self) -> None:
        """Abandon the stream (the gateway then returns any reserved tunnel)."""


class RemoteGatewayCall:
    """A raw-bytes bidi stream on another kas' private API."""

    def __init__(self, pool: KasPool, url: str, full_method: str, metadata: Metadata) -> None:
        # No (de)serializers: frames are relayed as bytes (kas.md §1.7 raw codec).
        multi: Any = pool.channel(url).stream_stream(full_method)
        self._call: Any = multi(metadata=metadata + pool.auth_metadata())
        # A gateway may end the call before the last request frame: that must not become INTERNAL.
        self._writer = CallWriter(self._call)

    async def read(self) -> kasapp_pb2.GatewayKasResponse | None:
        """Next gateway response; None at the gateway's clean end. Raises GatewayUnavailable."""
        try:
            data = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise GatewayUnavailable(exc.code(), exc.details() or "") from exc
        if data is grpc.aio.EOF:
            code = await self._call.code()
            if code is not grpc.StatusCode.OK:
                raise GatewayUnavailable(code, await self._call.details() or "")
            return None
        try:
            return kasapp_pb2.GatewayKasResponse.FromString(data)
        except Exception as exc:
            raise GatewayUnavailable(grpc.StatusCode.INTERNAL, f"undecodable gateway response: {exc}") from exc

    async def write(self, data: bytes) -> None:
        """Send a frame to the gateway.

        Raises:
            GatewayUnavailable: the call has ended (its outcome comes from :meth:`read`).
        """
        if not await self._writer.write(data):
            raise GatewayUnavailable(grpc.StatusCode.UNAVAILABLE, "the gateway call has ended")

    async def done_writing(self) -> None:
        """Half-close towards the gateway."""
        await self._writer.done_writing()

    def cancel(self) -> None:
        """Cancel the RPC; the gateway gives back a reserved tunnel."""
        self._call.cancel()


def _frame_size(item: object) -> int:
    if isinstance(item, bytes):
        return len(item)
    if isinstance(item, kasapp_pb2.GatewayKasResponse):
        return item.ByteSize()
    return 0


class _GatewayEnd:
    """The gateway's end of an in-memory pipe (a :class:`~tether.tunnel.server.gateway.RoutingPeer`).

    Both directions are :class:`~tether.tool.relay.BoundedPipe`: a slow client or a slow agent makes the other
    side wait instead of making kas buffer a whole response or upload (issue 9 item 2).
    """

    def __init__(self) -> None:
        self.inbound: BoundedPipe[bytes] = BoundedPipe(len)
        self.outbound: BoundedPipe[kasapp_pb2.GatewayKasResponse] = BoundedPipe(_frame_size)

    async def read(self) -> bytes | None:
        """Next frame from the routing side, None after its half-close."""
        return await self.inbound.get()

    async def write(self, response: kasapp_pb2.GatewayKasResponse) -> None:
        """Queue a response for the routing side, waiting while the pipe is full."""
        await self.outbound.put(response)


class LocalGatewayCall:
    """An in-memory stream to this kas' own gateway, served by a task running :meth:`Gateway.serve`."""

    def __init__(self, gateway: Gateway, full_method: str, metadata: Metadata) -> None:
        self._end = _GatewayEnd()
        self._task = asyncio.get_running_loop().create_task(self._serve(gateway, full_method, metadata))

    async def _serve(self, gateway: Gateway, full_method: str, metadata: Metadata) -> None:
        try:
            await gateway.serve(full_method, metadata, self._end)
        except GatewayError as exc:
            self._end.outbound.fail(GatewayUnavailable(exc.code, exc.message))
        except PipeClosed:
            pass  # the routing side cancelled
        except Exception as exc:
            self._end.outbound.fail(GatewayUnavailable(grpc.StatusCode.INTERNAL, f"gateway failed: {exc!r}"))
        else:
            self._end.outbound.close()
        finally:
            # Request frames the gateway will never read must not hold the routing side's writer.
            self._end.inbound.abandon()

    async def read(self) -> kasapp_pb2.GatewayKasResponse | None:
        """Next gateway response; None at the gateway's clean end. Raises GatewayUnavailable."""
        return await self._end.outbound.get()

    async def write(self, data: bytes) -> None:
        """Send a frame to the gateway, waiting while the pipe is full.

        Raises:
            GatewayUnavailable: the gateway has ended.
        """
        try:
            await self._end.inbound.put(data)
        except (PipeClosed, RuntimeError) as exc:
            raise GatewayUnavailable(grpc.StatusCode.UNAVAILABLE, "the gateway call has ended") from exc

    async def done_writing(self) -> None:
        """Half-close towards the gateway."""
        self._end.inbound.close()

    def cancel(self) -> None:
        """Stop the gateway task; it gives back a reserved tunnel."""
        self._end.outbound.abandon()
        self._task.cancel()
