"""One reverse tunnel as kas holds it: an agentk ``Connect`` stream that carries exactly one forwarded call.

kas sends the call to agentk as stream *responses* (``request_info``, ``message``*, ``close_send``) and
reads agentk's answer from stream *requests* (``header``, ``message``*, ``trailer``, ``error``), relaying
raw frames without decoding them (kas.md §1.2, §1.7; seed 001 "Implementation schema").
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import sys
from collections.abc import Mapping
from typing import Any, Protocol

import grpc
from google.rpc import status_pb2

from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.grpc_meta import Metadata, meta_to_values
from tether.tool.relay import AnswerFrames, dispatch, pump

ConnectContext = grpc.aio.ServicerContext[rpc_pb2.ConnectRequest, rpc_pb2.ConnectResponse]
ValuesMap = Mapping[str, prototool_pb2.Values]


class TunnelState(enum.Enum):
    """Lifecycle (kas.md §1.6): READY in the registry, FOUND by a caller, FORWARDING, DONE."""

    READY = "ready"
    FOUND = "found"
    FORWARDING = "forwarding"
    DONE = "done"


class IncomingStream(Protocol):
    """The caller's side of a forwarded call, as raw request frames."""

    async def read(self) -> bytes | None:
        """Return the next raw request message, or None at the caller's half-close."""


class ForwardSink(Protocol):
    """Receives agentk's answer; implemented by the gateway (wrapping it for the routing kas)."""

    async def header(self, meta: ValuesMap) -> None:
        """Response headers of the forwarded call."""

    async def message(self, data: bytes) -> None:
        """One raw response message."""

    async def trailer(self, meta: ValuesMap) -> None:
        """Trailers of the forwarded call."""


class TunnelBroken(Exception):
    """The tunnel failed during forwarding (agentk went away or broke the protocol)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def descriptor_methods(descriptor: info_pb2.AgentDescriptor) -> frozenset[tuple[str, str]]:
    """Return the (full service name, method name) pairs an agentk advertises.

    Equal descriptors give the same set object: every tunnel of an agent, and every agent of one version,
    sends the same descriptor, and a set per tunnel cost kas a few KiB per tunnel (issue 9's memory per agent).
    """
    return _shared_methods(descriptor.SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=1024)  # bounded: an agent may send any descriptor
def _shared_methods(serialized: bytes) -> frozenset[tuple[str, str]]:
    descriptor = info_pb2.AgentDescriptor.FromString(serialized)
    return frozenset((sys.intern(s.name), sys.intern(m.name)) for s in descriptor.services for m in s.methods)


class Tunnel:
    """A registered reverse tunnel of one agentk connection.

    Args:
        agent_id: the authenticated agent.
        descriptor: what agentk can serve (sent as the tunnel's first message).
        context: the kas side of the ``Connect`` RPC; only this object reads or writes it.
        connection_id: agentk's connection id (its pod id) when it sent one, for log lines.
    """

    __slots__ = ("_context", "agent_id", "connection_id", "finished", "methods", "state")  # thousands live at once

    def __init__(
        self,
        agent_id: int,
        descriptor: info_pb2.AgentDescriptor,
        context: ConnectContext,
        connection_id: int | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.connection_id = connection_id
        self.methods = descriptor_methods(descriptor)
        self.state = TunnelState.READY
        self._context = context
        #: Resolved with the status the Connect RPC should end with (None = OK) once the tunnel is finished.
        self.finished: asyncio.Future[tuple[grpc.StatusCode, str] | None] = asyncio.get_running_loop().create_future()

    def supports(self, service: str, method: str) -> bool:
        """True when agentk advertised ``service``/``method`` (exact match, kas.md §1.6)."""
        return (service, method) in self.methods

    def retire(self, status: tuple[grpc.StatusCode, str] | None = None) -> None:
        """Finish the tunnel without forwarding; its Connect RPC ends with ``status`` (None = OK)."""
        self.state = TunnelState.DONE
        if not self.finished.done():
            self.finished.set_result(status)

    async def forward(
        self, full_method: str, metadata: Metadata, incoming: IncomingStream, sink: ForwardSink
    ) -> status_pb2.Status | None:
        """Relay one call through the tunnel (kas.md §1.7).

        Args:
            full_method: ``/package.Service/Method``.
            metadata: request metadata for agentk (``kas-hop-*`` already removed).
            incoming: the caller's raw request frames.
            sink: receives agentk's header, messages and trailer.

        Returns:
            agentk's final status when the call failed on its side (the ``error`` message), else None.

        Raises:
            TunnelBroken: agentk disconnected or broke the stream order; the caller should see UNAVAILABLE.
            Exception: whatever ``incoming.read`` raised (the caller went away); agentk's tunnel is cancelled.
        """
        self.state = TunnelState.FORWARDING
        tunnel_status: tuple[grpc.StatusCode, str] | None = None
        request_info = rpc_pb2.RequestInfo(method_name=full_method, meta=meta_to_values(metadata))
        to_agent: asyncio.Task[None] | None = None
        from_agent: asyncio.Task[status_pb2.Status | None] | None = None
        try:
            await self._send(rpc_pb2.ConnectResponse(request_info=request_info))
            to_agent = asyncio.create_task(self._pump_to_agent(incoming))
            from_agent = asyncio.create_task(self._pump_from_agent(sink))
            await asyncio.wait({to_agent, from_agent}, return_when=asyncio.FIRST_COMPLETED)
            if to_agent.done() and (failure := to_agent.exception()) is not None:
                if not isinstance(failure, TunnelBroken):
                    tunnel_status = (grpc.StatusCode.CANCELLED, "read from incoming stream failed")
                raise failure
            # When agentk has answered, the caller may still hold its side open (e.g. server streaming).
            return await from_agent
        except TunnelBroken as exc:
            tunnel_status = (exc.code, exc.message)
            raise
        except asyncio.CancelledError:
            tunnel_status = (grpc.StatusCode.CANCELLED, "forwarded call cancelled")
            raise
        finally:
            for task in (to_agent, from_agent):
                if task is None:
                    continue
                if not task.done():
                    task.cancel()
                # Awaiting marks a failure as retrieved: a pump failing after the outcome is known is expected.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.retire(tunnel_status)

    async def _send(self, response: rpc_pb2.ConnectResponse) -> None:
        try:
            await self._context.write(response)
        except Exception as exc:  # the Connect RPC is gone
            raise TunnelBroken(grpc.StatusCode.UNAVAILABLE, f"tunnel write failed: {exc}") from exc

    async def _send_message(self, data: bytes) -> None:
        await self._send(rpc_pb2.ConnectResponse(message=rpc_pb2.Message(data=data)))

    async def _close_send(self) -> None:
        await self._send(rpc_pb2.ConnectResponse(close_send=rpc_pb2.CloseSend()))

    async def _pump_to_agent(self, incoming: IncomingStream) -> None:
        await pump(incoming.read, self._send_message, self._close_send)

    async def _read(self) -> rpc_pb2.ConnectRequest | None:
        try:
            request: Any = await self._context.read()
        except Exception as exc:
            raise TunnelBroken(grpc.StatusCode.UNAVAILABLE, f"tunnel read failed: {exc}") from exc
        return None if request is grpc.aio.EOF else request

    async def _pump_from_agent(self, sink: ForwardSink) -> status_pb2.Status | None:
        answer = AnswerFrames(sink.header, sink.message, sink.trailer)
        automaton = StreamAutomaton(rpc_pb2.ConnectRequest, after="descriptor")
        try:
            await dispatch(self._read, automaton, answer.handlers())
        except StreamOrderError as exc:
            raise TunnelBroken(grpc.StatusCode.UNAVAILABLE, f"agentk broke the tunnel protocol: {exc}") from exc
        return answer.error
