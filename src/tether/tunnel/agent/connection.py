"""One agentk reverse-tunnel connection: a loop of ``ReverseTunnel.Connect`` attempts (kas.md §1.4).

Each attempt opens ``Connect`` (wait-for-ready), sends the ``descriptor``, and waits. kas either ends the
stream unused, or sends ``request_info`` (+ ``message``/``close_send``) for one call, which the handler
registered on agentk's internal server serves in this process (:mod:`tether.modagent.local_call`); its
headers, messages, trailers and status flow back as ``header``/``message``/``trailer``/``error``
(kas.md §1.2-1.3). One tunnel carries one call (§1.1);
the loop then opens the next tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from grpc import aio

from tether.modagent.local_call import LocalCall, SinkClosed
from tether.pb.gitlab.agent.reverse_tunnel.info import info_pb2
from tether.pb.gitlab.agent.reverse_tunnel.rpc import rpc_pb2, rpc_pb2_grpc
from tether.tool import tracing
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.backoff import Backoff
from tether.tool.grpc_meta import Metadata, meta_to_values, status_to_proto, values_to_meta
from tether.tool.grpc_stream import CallWriter
from tether.tool.relay import dispatch
from tether.tunnel.agent.pool import TunnelListener

if TYPE_CHECKING:
    from tether.tool.tracing_sdk import Span

__all__ = ["ConnectedTunnels", "TunnelConnection", "reconnect_backoff"]

_log = structlog.get_logger(__name__)

_TunnelCall = aio.StreamStreamCall[rpc_pb2.ConnectRequest, rpc_pb2.ConnectResponse]
_RawCall = aio.StreamStreamCall[bytes, bytes]


def reconnect_backoff() -> Backoff:
    """The reconnect backoff of one tunnel loop: 1 s to 3 s, factor 1.6, jitter 0.2, reset after 25 s.

    Upstream grows to 20 s (kas.md §1.4); after a kas outage of a minute that kept agents away 14-20 s after kas
    was back. Bounded at 3 s (plus jitter), an agent reconnects within 5 s of kas being ready (issue 9 item 7).
    """
    return Backoff(initial_s=1.0, max_s=3.0, factor=1.6, jitter=0.2, reset_after_s=25.0)


class ConnectedTunnels:
    """Number of tunnels whose ``Connect`` stream is open (descriptor sent), shared by all loops.

    Feeds the ``connected`` metric and agentk's readiness ("at least one tunnel connected").
    """

    def __init__(self) -> None:
        self.value = 0

    def add(self, delta: int) -> None:
        """Change the count by ``delta`` (+1 when a tunnel opens, -1 when it ends)."""
        self.value += delta


class _Outcome(enum.Enum):
    RECONNECT = "reconnect"  # clean end, cancel or deadline: open the next tunnel at once
    BACKOFF = "backoff"  # any other failure: wait first


class TunnelConnection:
    """Keeps opening tunnels to kas until stopped, serving at most one call per tunnel (kas.md §1.4).

    Args:
        kas_channel: channel to kas' agent listener.
        handlers: the handler registered for a method (``InternalServer.handler``), or None.
        descriptor: the services this agentk serves, sent first on every tunnel.
        listener: the manager, told ``on_active`` when a request arrives and ``on_idle`` after each attempt.
        metadata: per-RPC metadata for ``Connect``: ``authorization: Bearer <token>`` (kas.md §4.1) and the
            ``--kas-header`` pairs.
        backoff: delays after failed attempts; defaults to :func:`reconnect_backoff`.
        connected: shared counter of open tunnels, if wanted.
    """

    def __init__(
        self,
        kas_channel: aio.Channel,
        handlers: Callable[[str], grpc.RpcMethodHandler[Any, Any] | None],
        descriptor: info_pb2.AgentDescriptor,
        listener: TunnelListener,
        *,
        metadata: Metadata = (),
        backoff: Backoff | None = None,
        connected: ConnectedTunnels | None = None,
    ) -> None:
        self._connect = rpc_pb2_grpc.ReverseTunnelStub(kas_channel).Connect
        self._handlers = handlers
        self._descriptor = rpc_pb2.ConnectRequest(
            descriptor=rpc_pb2.Descriptor(agent_descriptor=descriptor)
        ).SerializeToString()
        self._listener = listener
        self._metadata = metadata
        self._backoff = backoff or reconnect_backoff()
        self._connected = connected or ConnectedTunnels()
        self._stop_event = asyncio.Event()
        self._attempt_task: asyncio.Task[_Outcome] | None = None
        self._in_flight = False

    @property
    def in_flight(self) -> bool:
        """Whether the current tunnel is carrying a call."""
        return self._in_flight

    async def run(self) -> None:
        """Open tunnels one after another until :meth:`stop` or :meth:`abort`; return after the last one ended.

        Cancelling ``run()`` stops the loop too: an idle tunnel is closed, but a call in flight is shielded
        and finishes in the background (kas.md §1.4; :meth:`abort` still cancels it).
        """
        while not self._stop_event.is_set():
            self._in_flight = False
            task = asyncio.create_task(self._attempt())
            self._attempt_task = task
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                self._stop_event.set()
                if not self._in_flight:
                    task.cancel()
                raise
            outcome = None if task.cancelled() else task.result()
            self._listener.on_idle()
            if outcome is _Outcome.BACKOFF:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_event.wait(), self._backoff.next_delay())

    def stop(self) -> None:
        """Stop after the current attempt; an idle tunnel is closed now, a call in flight may finish."""
        self._stop_event.set()
        if self._attempt_task is not None and not self._in_flight:
            self._attempt_task.cancel()

    def abort(self) -> None:
        """Stop now, cancelling a call in flight too (shutdown grace period expired)."""
        self._stop_event.set()
        if self._attempt_task is not None:
            self._attempt_task.cancel()

    async def _attempt(self) -> _Outcome:
        call: _TunnelCall = self._connect(metadata=self._metadata, wait_for_ready=True)
        writer = CallWriter(call)
        forward: _ForwardedCall | None = None
        opened = False

        async def read() -> rpc_pb2.ConnectResponse | None:
            response = await call.read()
            return None if response is aio.EOF else response  # type: ignore[return-value]

        async def on_request_info(response: rpc_pb2.ConnectResponse) -> None:
            nonlocal forward
            self._in_flight = True
            self._listener.on_active()
            forward = _ForwardedCall(self._handlers, response.request_info, writer)

        async def on_message(response: rpc_pb2.ConnectResponse) -> None:
            if forward is not None:
                await forward.send(response.message.data)

        async def on_close_send(_response: rpc_pb2.ConnectResponse) -> None:
            if forward is not None:
                await forward.close_send()

        try:
            if not await writer.write(self._descriptor):
                return _classify(await call.code(), await call.details() or "")
            opened = True
            self._connected.add(1)
            handlers = {"request_info": on_request_info, "message": on_message, "close_send": on_close_send}
            await dispatch(read, StreamAutomaton(rpc_pb2.ConnectResponse), handlers)
            return _Outcome.RECONNECT
        except aio.AioRpcError as exc:
            return _classify(exc.code(), exc.details() or "")
        except StreamOrderError as exc:
            _log.error("tunnel_protocol_violation", error=str(exc))
            return _Outcome.BACKOFF
        except Exception:
            _log.exception("tunnel_attempt_failed")
            return _Outcome.BACKOFF
        finally:
            if opened:
                self._connected.add(-1)
            if forward is not None:
                await forward.finish()
            call.cancel()


def _classify(code: grpc.StatusCode, details: str) -> _Outcome:
    """Map how a tunnel ended to the reconnect rule of kas.md §1.4 step 4, logging real failures."""
    if code in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
        _log.debug("tunnel_ended", code=code.name, details=details)
        return _Outcome.RECONNECT
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        _log.error("tunnel_rejected_token", code=code.name, details=details, hint="kas rejected the agent token")
    else:
        _log.warning("tunnel_failed", code=code.name, details=details)
    return _Outcome.BACKOFF


class _ForwardedCall:
    r"""The one call a tunnel carries, served by its registered handler in-process (kas.md §1.4 step 3).

    The answer goes out as ``header``, ``message``\*, ``trailer`` and, unless OK, ``error``, then the
    half-close, through the tunnel's :class:`~tether.tool.grpc_stream.CallWriter`: kas may end the tunnel while
    agentk still answers, which must not turn into an ``INTERNAL`` status.
    """

    def __init__(
        self,
        handlers: Callable[[str], grpc.RpcMethodHandler[Any, Any] | None],
        info: rpc_pb2.RequestInfo,
        tunnel: CallWriter,
    ) -> None:
        self._tunnel = tunnel
        self._method = info.method_name
        handler = handlers(info.method_name) if _valid_method(info.method_name) else None
        _log.debug("tunnel_request", method=info.method_name)
        self._call: LocalCall | None = None
        self._refusal: asyncio.Task[None] | None = None
        self._span: Span | None = None
        if handler is not None:
            metadata = values_to_meta(info.meta)
            tracer = tracing.TRACER
            if tracer is not None:
                # agentk's hop as a server span, a child of the gateway kas' span (issue 25 item 3).
                self._span = tracer.start(f"agentk {self._method}", "server", metadata, {"rpc.method": self._method})
                metadata = tracing.with_trace(metadata, self._span.carrier())
            self._call = LocalCall(handler, metadata, self)
        else:
            self._refusal = asyncio.create_task(self._refuse())

    async def send(self, data: bytes) -> None:
        """Hand one request message (kas ``message``) to the call; dropped once the call has ended."""
        if self._call is not None:
            await self._call.send(data)

    async def close_send(self) -> None:
        """End the request stream (kas ``close_send``)."""
        if self._call is not None:
            await self._call.close_send()

    async def finish(self) -> None:
        """Cancel whatever is still running (the tunnel ended first) and wait for it to stop."""
        if self._call is not None:
            self._call.cancel()
            await self._call.wait()
        if self._refusal is not None:
            self._refusal.cancel()
            await asyncio.wait({self._refusal})
        if self._span is not None:
            self._span.end()

    async def header(self, metadata: Metadata) -> None:
        """:class:`~tether.modagent.local_call.CallSink`: the response's initial metadata."""
        await self._send(rpc_pb2.ConnectRequest(header=rpc_pb2.Header(meta=meta_to_values(metadata))))

    async def message(self, data: bytes) -> None:
        """:class:`~tether.modagent.local_call.CallSink`: one response message."""
        await self._send(rpc_pb2.ConnectRequest(message=rpc_pb2.Message(data=data)))

    async def end(self, code: grpc.StatusCode, details: str, trailers: Metadata) -> None:
        """Trailer, the status unless OK, then the half-close."""
        if self._span is not None:
            self._span.grpc_status(code.value[0], details)
        await self._send(rpc_pb2.ConnectRequest(trailer=rpc_pb2.Trailer(meta=meta_to_values(trailers))))
        if code is not grpc.StatusCode.OK:
            _log_failed_call(self._method, code, details)
            status = status_to_proto(code, details, trailers)
            await self._send(rpc_pb2.ConnectRequest(error=rpc_pb2.Error(status=status)))
        await self._tunnel.done_writing()

    async def _send(self, request: rpc_pb2.ConnectRequest) -> None:
        if not await self._tunnel.write(request.SerializeToString()):
            _log.info("tunnel_call_aborted", method=self._method)
            raise SinkClosed

    async def _refuse(self) -> None:
        # grpcio's answer to an unknown method, so kas sees the same status as from a server.
        reason = "Method not found!" if _valid_method(self._method) else f"malformed method name {self._method!r}"
        with contextlib.suppress(SinkClosed):
            await self.header(())
            await self.end(grpc.StatusCode.UNIMPLEMENTED, reason, ())


def _log_failed_call(method: str, code: grpc.StatusCode, details: str) -> None:
    # Every failed forwarded call is logged with its reason; a cancelled one (the client left) is routine.
    log = _log.info if code is grpc.StatusCode.CANCELLED else _log.warning
    log("tunnel_call_failed", method=method, code=code.name, reason=details)


def _valid_method(name: str) -> bool:
    # "/package.Service/Method"
    parts = name.split("/")
    return len(parts) == 3 and parts[0] == "" and all(parts[1:])
