"""agentk's outbound half of HTTP over gRPC (kas.md §5.4): ``HttpRequest`` frames in, an HTTP request out.

One request carried by ``grpctool.HttpRequest`` frames is sent to an HTTP server and its response is streamed
back as ``grpctool.HttpResponse`` frames. Shared by every agent module that forwards HTTP (``kubernetes_api``
to the API server, ``workspace_access`` to a workspace's Service): :class:`RequestFrames` reads the request
stream with its order checked, and :class:`OutboundHttp` makes the request. Plain requests go through aiohttp
with the body streamed as it arrives and the response relayed in chunks of at most 32 KiB as they arrive;
upgrade requests are written by hand (``upgrade_client.py``) so that after a ``101`` the raw bytes flow both ways
untouched. Every hop waits for the next (bounded queues, gRPC flow control), so a slow reader at either end
stalls its source instead of filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import grpc
import yarl
from grpc import aio

from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool import tracing
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.http_grpc.headers import canonical_key, clean_headers, to_values, via_value
from tether.tool.http_grpc.upgrade_client import UpgradeExchange, UpgradeProtocolError, open_exchange
from tether.tool.status import StatusError
from tether.tool.tracing import TRACE_KEYS

if TYPE_CHECKING:
    from tether.tool.tracing_sdk import Tracer

__all__ = [
    "MAX_CHUNK",
    "OUTBOUND_ERRORS",
    "AgentRequestError",
    "MakeRequestServicer",
    "OutboundHttp",
    "RequestFrames",
    "Send",
    "response_head",
]

#: Largest ``data`` / ``upgradeData`` payload in bytes.
MAX_CHUNK = 32 * 1024
#: aiohttp adds these by itself unless told not to; the request already says what it wants.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse
Send = Callable[[_Response], Awaitable[None]]
#: What a failed outbound request raises (the server unreachable, or failing mid-response).
OUTBOUND_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, UpgradeProtocolError, asyncio.IncompleteReadError)


class AgentRequestError(StatusError):
    """The forwarded call fails with gRPC status ``code`` and ``message`` (e.g. a broken request stream)."""


class RequestFrames:
    """Reads the request stream in the background: body chunks, then upgrade data (order checked).

    Use :meth:`header` first, then run :meth:`run` as a task; the body and upgrade data come out of
    :attr:`body` and :attr:`upgrade` (each holds at most 4 frames: the reader waits for the consumer).

    Args:
        requests: the call's request messages.
    """

    def __init__(self, requests: AsyncIterator[_Request]) -> None:
        self._requests = requests
        self._automaton = StreamAutomaton(_Request)
        self.body: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=4)
        self.upgrade: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=4)
        self._discard_body = False
        self._body_ended = asyncio.Event()

    async def header(self) -> _Request.Header:
        """The first frame, which must be the header.

        Raises:
            AgentRequestError: INVALID_ARGUMENT for an empty stream or another first frame.
        """
        try:
            first = await anext(self._requests)
            self._automaton.visit(first)
        except StopAsyncIteration:
            raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, "empty request stream") from None
        except StreamOrderError as exc:
            raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return first.header

    async def run(self) -> None:
        """Sort the remaining frames into :attr:`body` and :attr:`upgrade`; errors end up in the queue read next."""
        target = self.body
        try:
            async for message in self._requests:
                kind = self._automaton.visit(message)
                if kind == "data" and not self._discard_body:
                    await self.body.put(bytes(message.data.data))
                elif kind == "trailer":
                    if not self._discard_body:
                        await self.body.put(None)
                    self._body_ended.set()
                    target = self.upgrade
                elif kind == "upgradeData":
                    await self.upgrade.put(bytes(message.upgradeData.data))
            self._automaton.end()
            await self.upgrade.put(None)
        except StreamOrderError as exc:
            await target.put(AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
        except Exception as exc:  # the call itself broke: kas or its client went away
            await target.put(AgentRequestError(grpc.StatusCode.CANCELLED, f"request stream failed: {exc!r}"))
        finally:
            self._body_ended.set()

    async def skip_rest_of_body(self) -> None:
        """Drop body chunks nobody reads and wait for the request's trailer (or the stream's end)."""
        self._discard_body = True
        while not self._body_ended.is_set():
            ended = asyncio.ensure_future(self._body_ended.wait())
            taken = asyncio.ensure_future(self.body.get())  # frees the reader if it waits on a full queue
            try:
                await asyncio.wait({ended, taken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ended.cancel()
                taken.cancel()

    @staticmethod
    async def drain(queue: asyncio.Queue[bytes | BaseException | None]) -> AsyncIterator[bytes]:
        """Yield the queue's chunks until its end (None); a queued exception is raised."""
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def response_head(status: int, reason: str, version: tuple[int, int], pairs: list[tuple[str, str]]) -> _Response:
    """The ``header`` frame of a response: cleaned headers plus this agent's ``Via`` entry."""
    headers = clean_headers(pairs)
    headers.setdefault("Via", []).append(via_value(f"{version[0]}.{version[1]}", "gitlab-agent"))
    response = prototool_pb2.HttpResponse(status_code=status, status=f"{status} {reason}", header=to_values(headers))
    return _Response(header=_Response.Header(response=response))


def _slices(data: bytes) -> list[bytes]:
    return [data[i : i + MAX_CHUNK] for i in range(0, len(data), MAX_CHUNK)] or [b""]


def _data(chunk: bytes) -> _Response:
    return _Response(data=_Response.Data(data=chunk))


class MakeRequestServicer:
    """Base of the agent servicers whose ``MakeRequest`` carries one HTTP request (``grpctool.HttpRequest``).

    Subclasses implement :meth:`serve`; a :class:`~tether.tool.status.StatusError` it raises ends the call with
    its status.

    Args:
        http: the connection pool the requests go out through (closed by :meth:`close`).
    """

    def __init__(self, http: OutboundHttp) -> None:
        self._http = http

    def handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """Method name -> handler, for ``InternalServer.add_generic_handler(<service>, ...)``."""
        return {
            "MakeRequest": grpc.stream_stream_rpc_method_handler(
                self._make_request,
                request_deserializer=_Request.FromString,
                response_serializer=_Response.SerializeToString,
            )
        }

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.close()

    async def _make_request(
        self, requests: AsyncIterator[_Request], context: aio.ServicerContext[_Request, _Response]
    ) -> None:
        # The call's (empty) initial metadata goes out now, while the HTTP request is made: sent with the first
        # response frame it cost a tunnel write waited on between the server's answer and kas (issue 28). A
        # failing call still sends it first, as every tunnelled call does (modagent/local_call.py).
        await context.send_initial_metadata(())
        try:
            await self.serve(requests, context.write)
        except StatusError as exc:
            await exc.abort(context)

    async def serve(self, requests: AsyncIterator[_Request], send: Send) -> None:
        """Make the HTTP request carried by ``requests`` and ``send`` the response frames.

        Raises:
            StatusError: the call's failure status.
        """
        raise NotImplementedError


class OutboundHttp:
    """Makes forwarded HTTP requests over one connection pool; use inside a running event loop, :meth:`close` after.

    Args:
        ssl_context: builds the TLS context for ``https`` URLs (called once), or None for plain HTTP only.
        connect_timeout_s: limit for TCP connect and TLS handshake, seconds.
    """

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext | None] | None, connect_timeout_s: float) -> None:
        self._ssl_context = ssl_context
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._upgrade_ssl: ssl.SSLContext | None = None

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(
        self,
        frames: RequestFrames,
        header: _Request.Header,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        upgrade: bool,
        send: Send,
    ) -> None:
        """Send the request whose body (and upgrade data) ``frames`` delivers; ``send`` the response frames.

        Args:
            frames: the request stream, its header already read (:meth:`RequestFrames.header`).
            header: that header (method, ``content_length``).
            url: absolute URL with the query.
            headers: request headers, cleaned for this hop; a ``Host`` header replaces the URL's host.
            upgrade: whether the request asks for an upgrade (then the connection stays open after a ``101``).
            send: writes one response frame to kas (waits while the call's window is full).

        Raises:
            OUTBOUND_ERRORS: the server could not be reached or failed mid-response.
            AgentRequestError: the request stream broke.
        """
        tracer = tracing.TRACER
        if tracer is not None:
            await self._forward_traced(tracer, frames, header, url, headers, upgrade, send)
            return
        await self._forward(frames, header, url, headers, upgrade, send)

    async def _forward_traced(
        self,
        tracer: Tracer,
        frames: RequestFrames,
        header: _Request.Header,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        upgrade: bool,
        send: Send,
    ) -> None:
        """:meth:`forward` as a client span whose ``traceparent`` the server receives (issue 25 item 3)."""
        method = header.request.method
        attributes = {"http.request.method": method, "url.full": str(url.with_query(None))[:512]}
        span = tracer.start_child(f"HTTP {method}", attributes)
        if span is None:  # not within a traced call (the internal server's interceptor makes its context current)
            await self._forward(frames, header, url, headers, upgrade, send)
            return
        headers = [(k, v) for k, v in headers if k.lower() not in TRACE_KEYS]
        headers += [(canonical_key(k), v) for k, v in span.carrier()]

        async def observed(message: _Response) -> None:
            if message.HasField("header"):
                span.http_status(message.header.response.status_code, server=False)
            await send(message)

        try:
            await self._forward(frames, header, url, headers, upgrade, observed)
        except BaseException as exc:
            span.fail(repr(exc))
            raise
        finally:
            span.end()

    async def _forward(
        self,
        frames: RequestFrames,
        header: _Request.Header,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        upgrade: bool,
        send: Send,
    ) -> None:
        method = header.request.method
        content_length = header.content_length if header.HasField("content_length") else -1
        reader = asyncio.create_task(frames.run(), name="http-request-frames")
        try:
            if upgrade:
                await self._upgrade(method, url, headers, frames, content_length, send)
            else:
                await self._plain(method, url, headers, frames, content_length, send)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            context = self._ssl_context() if self._ssl_context is not None else None
            # No connection limit: every watch or long poll holds a connection for its lifetime.
            connector = aiohttp.TCPConnector(ssl=context if context is not None else False, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
                auto_decompress=False,  # bytes are relayed as the server sent them
                # Every user's requests share this session: a cookie one answer set must reach that user only
                # (relayed in the answer), never be sent with anyone's next request.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def _plain(
        self,
        method: str,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        frames: RequestFrames,
        content_length: int,
        send: Send,
    ) -> None:
        # content_length 0 means no body at all (kas.md §5.4, upstream issue #393).
        body = frames.drain(frames.body) if content_length != 0 else None
        async with self._ensure_session().request(
            method,
            url,
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers=_NO_AUTO_HEADERS,
        ) as response:
            version = (response.version.major, response.version.minor) if response.version else (1, 1)
            await send(response_head(response.status, response.reason or "", version, list(response.headers.items())))
            async for chunk in response.content.iter_any():
                for piece in _slices(chunk):
                    await send(_data(piece))
        await send(_Response(trailer=_Response.Trailer()))
        # End the call only once kas has sent the whole request: a call that ends while kas still writes
        # request frames makes kas' writes fail.
        await frames.skip_rest_of_body()

    async def _upgrade(
        self,
        method: str,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        frames: RequestFrames,
        content_length: int,
        send: Send,
    ) -> None:
        body = frames.drain(frames.body)
        if content_length == 0:
            # Consume the (empty) body so the request frames reach the upgrade data.
            async for _ in body:
                pass
        if self._upgrade_ssl is None and url.scheme == "https" and self._ssl_context is not None:
            self._upgrade_ssl = self._ssl_context()
            if self._upgrade_ssl is not None:
                self._upgrade_ssl.set_alpn_protocols(["http/1.1"])  # upgrades need HTTP/1.1 (kas.md §5.4)
        exchange = await open_exchange(
            url,
            method,
            [(k, v) for k, v in headers if k.lower() != "content-length" or content_length > 0],
            body if content_length != 0 else None,
            content_length,
            self._upgrade_ssl,
            self._connect_timeout_s,
        )
        try:
            await send(response_head(exchange.status, exchange.reason, exchange.version, exchange.headers))
            if exchange.status != 101:
                async for piece in exchange.body(MAX_CHUNK):
                    await send(_data(piece))
                await send(_Response(trailer=_Response.Trailer()))
                return
            await send(_Response(trailer=_Response.Trailer()))
            await _relay(exchange, frames, send)
        finally:
            await exchange.close()


async def _relay(exchange: UpgradeExchange, frames: RequestFrames, send: Send) -> None:
    """Pump raw bytes both ways until the server closes the connection."""

    async def to_server() -> None:
        async for data in frames.drain(frames.upgrade):
            exchange.writer.write(data)
            await exchange.writer.drain()
        if exchange.writer.can_write_eof():
            exchange.writer.write_eof()  # the client half-closed

    outbound = asyncio.create_task(to_server(), name="http-upgrade-out")
    try:
        while data := await exchange.reader.read(MAX_CHUNK):
            await send(_Response(upgradeData=_Response.UpgradeData(data=data)))
            if outbound.done() and not outbound.cancelled() and outbound.exception() is not None:
                break
    finally:
        outbound.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await outbound
