"""agentk half of the Kubernetes API proxy: ``KubernetesApi.MakeRequest`` on the internal server (kas.md §5.4).

Each call carries one HTTP request (``header``, ``data``*, ``trailer``, then ``upgradeData``* after a
``101``; the order is checked against the ``HttpRequest`` automaton). It is sent to the API server with
the agent's own credentials (token or client certificate from the kubeconfig or the pod's ServiceAccount),
after removing hop-by-hop headers and the caller's ``Authorization``. When kas imposes an identity
(``HeaderExtra.imp_config``), the ``Impersonate-*`` headers are added, and a request that already carries
such headers is refused (``PERMISSION_DENIED``, nested impersonation). The response streams back as
``header``, ``data`` chunks of at most 32 KiB as they arrive, ``trailer`` and, after a ``101``,
``upgradeData`` both ways on the raw connection (``agent_upgrade.py``). Failures to talk to the API
server end the call with ``UNAVAILABLE "gRPC -> HTTP: ..."``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import structlog
import yarl
from grpc import aio

from tether.kube.kubeconfig import KubeCredentials
from tether.modules.kubernetes_api.agent.upgrade import UpgradeExchange, UpgradeProtocolError, open_exchange
from tether.modules.kubernetes_api.rpc.headers import clean_headers, from_values, is_upgrade, to_values, via_value
from tether.modules.kubernetes_api.rpc.impersonation import (
    NESTED_IMPERSONATION,
    carries_impersonation,
    impersonation_headers,
)
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.status import StatusError

__all__ = ["SERVICE", "AgentRequestError", "KubernetesApiAgent"]

_log = structlog.get_logger(__name__)

SERVICE = "gitlab.agent.kubernetes_api.rpc.KubernetesApi"
#: Largest ``data`` / ``upgradeData`` payload in bytes.
MAX_CHUNK = 32 * 1024
#: TCP connect + TLS handshake limit towards the API server, seconds (kas.md §5.4).
CONNECT_TIMEOUT_S = 30.0
#: A rotated ServiceAccount token file is re-read after this many seconds.
TOKEN_REREAD_S = 60.0
#: The caller's credentials never reach the API server; the agent's own are used.
_CALLER_AUTH = ("Authorization",)
#: aiohttp adds these by itself unless told not to; the request already says what it wants.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_Request = grpctool_pb2.HttpRequest
_Response = grpctool_pb2.HttpResponse
Send = Callable[[_Response], Awaitable[None]]


class AgentRequestError(StatusError):
    """The call fails with gRPC status ``code`` and ``message``."""


class _Token:
    """The agent's bearer token: static, or re-read from a file the kubelet rotates."""

    def __init__(self, value: str | None, path: Path | None) -> None:
        self._value = value
        self._path = path
        self._read_at = -TOKEN_REREAD_S

    def get(self) -> str | None:
        if self._path is not None and time.monotonic() - self._read_at >= TOKEN_REREAD_S:
            try:
                self._value = self._path.read_text().strip()
                self._read_at = time.monotonic()
            except OSError as exc:
                if self._value is None:
                    raise AgentRequestError(
                        grpc.StatusCode.UNAVAILABLE, f"gRPC -> HTTP: cannot read token file {self._path}: {exc}"
                    ) from exc
        return self._value


class _RequestFrames:
    """Reads the request stream in the background: body chunks, then upgrade data (order checked)."""

    def __init__(self, requests: AsyncIterator[_Request]) -> None:
        self._requests = requests
        self._automaton = StreamAutomaton(_Request)
        self.body: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=4)
        self.upgrade: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=4)
        self._discard_body = False
        self._body_ended = asyncio.Event()

    async def header(self) -> _Request.Header:
        try:
            first = await anext(self._requests)
            self._automaton.visit(first)
        except StopAsyncIteration:
            raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, "empty request stream") from None
        except StreamOrderError as exc:
            raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        return first.header

    async def run(self) -> None:
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
        while True:
            item = await queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def _imp_config(header: _Request.Header) -> rpc_pb2.ImpersonationConfig | None:
    if not header.HasField("extra"):
        return None
    extra = rpc_pb2.HeaderExtra()
    if not header.extra.Unpack(extra):
        raise AgentRequestError(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected header extra {header.extra.type_url!r}")
    return extra.imp_config if extra.HasField("imp_config") else None


def _head(status: int, reason: str, version: tuple[int, int], pairs: list[tuple[str, str]]) -> _Response:
    headers = clean_headers(pairs)
    headers.setdefault("Via", []).append(via_value(f"{version[0]}.{version[1]}", "gitlab-agent"))
    response = prototool_pb2.HttpResponse(status_code=status, status=f"{status} {reason}", header=to_values(headers))
    return _Response(header=_Response.Header(response=response))


def _slices(data: bytes) -> list[bytes]:
    return [data[i : i + MAX_CHUNK] for i in range(0, len(data), MAX_CHUNK)] or [b""]


def _data(chunk: bytes) -> _Response:
    return _Response(data=_Response.Data(data=chunk))


class KubernetesApiAgent:
    """Serves ``KubernetesApi.MakeRequest`` with the agent's Kubernetes credentials.

    Use inside a running event loop; :meth:`close` when done.

    Args:
        credentials: the API server URL, TLS material and token of the agent.
        connect_timeout_s: limit for connecting to the API server, seconds.
    """

    def __init__(self, credentials: KubeCredentials, *, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self._credentials = credentials
        self._base = yarl.URL(credentials.server)
        self._token = _Token(credentials.token, credentials.token_file)
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._upgrade_ssl: ssl.SSLContext | None = None

    def handlers(self) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
        """Method name -> handler, for ``InternalServer.add_generic_handler(SERVICE, ...)``."""
        return {
            "MakeRequest": grpc.stream_stream_rpc_method_handler(
                self._make_request,
                request_deserializer=_Request.FromString,
                response_serializer=_Response.SerializeToString,
            )
        }

    async def close(self) -> None:
        """Close the connection pool to the API server."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _make_request(
        self, requests: AsyncIterator[_Request], context: aio.ServicerContext[_Request, _Response]
    ) -> None:
        try:
            await self.serve(requests, context.write)
        except AgentRequestError as exc:
            await exc.abort(context)

    async def serve(self, requests: AsyncIterator[_Request], send: Send) -> None:
        """Make the HTTP request carried by ``requests`` and ``send`` the response frames.

        Raises:
            AgentRequestError: INVALID_ARGUMENT (broken request stream), PERMISSION_DENIED (nested
                impersonation), UNAVAILABLE (``gRPC -> HTTP: ...``: the API server could not be reached or
                failed mid-response).
        """
        frames = _RequestFrames(requests)
        header = await frames.header()
        imp_config = _imp_config(header)
        incoming = from_values(header.request.header)
        if imp_config is not None and (name := carries_impersonation(k for k, _ in incoming)):
            raise AgentRequestError(
                grpc.StatusCode.PERMISSION_DENIED, f"{NESTED_IMPERSONATION}: the request carries {name}"
            )
        upgrade = is_upgrade(incoming)
        headers = [(k, v) for k, values in clean_headers(incoming, drop=_CALLER_AUTH).items() for v in values]
        headers.append(("Via", via_value("gRPC/1.0", "gitlab-agent")))
        if imp_config is not None:
            headers += impersonation_headers(imp_config)
        token = self._token.get()
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        url = self._base.with_path(self._base.path.rstrip("/") + header.request.url_path).with_query(
            from_values(header.request.query)
        )
        reader = asyncio.create_task(frames.run(), name="k8s-proxy-request-frames")
        content_length = header.content_length if header.HasField("content_length") else -1
        try:
            if upgrade:
                await self._upgrade(header.request.method, url, headers, frames, content_length, send)
            else:
                await self._plain(header.request.method, url, headers, frames, content_length, send)
        except (aiohttp.ClientError, OSError, TimeoutError, UpgradeProtocolError, asyncio.IncompleteReadError) as exc:
            _log.info("k8s_proxy_request_failed", method=header.request.method, path=url.path, error=repr(exc))
            raise AgentRequestError(grpc.StatusCode.UNAVAILABLE, f"gRPC -> HTTP: {exc!r}") from exc
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            context = self._credentials.ssl_context()
            # No connection limit: every watch holds a connection for its lifetime.
            connector = aiohttp.TCPConnector(ssl=context if context is not None else False, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
                auto_decompress=False,  # bytes are relayed as the API server sent them
            )
        return self._session

    async def _plain(
        self,
        method: str,
        url: yarl.URL,
        headers: list[tuple[str, str]],
        frames: _RequestFrames,
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
            await send(_head(response.status, response.reason or "", version, list(response.headers.items())))
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
        frames: _RequestFrames,
        content_length: int,
        send: Send,
    ) -> None:
        body = frames.drain(frames.body)
        if content_length == 0:
            # Consume the (empty) body so the request frames reach the upgrade data.
            async for _ in body:
                pass
        if self._upgrade_ssl is None and url.scheme == "https":
            self._upgrade_ssl = self._credentials.ssl_context()
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
            await send(_head(exchange.status, exchange.reason, exchange.version, exchange.headers))
            if exchange.status != 101:
                async for piece in exchange.body(MAX_CHUNK):
                    await send(_data(piece))
                await send(_Response(trailer=_Response.Trailer()))
                return
            await send(_Response(trailer=_Response.Trailer()))
            await self._relay(exchange, frames, send)
        finally:
            await exchange.close()

    @staticmethod
    async def _relay(exchange: UpgradeExchange, frames: _RequestFrames, send: Send) -> None:
        """Pump raw bytes both ways until the API server closes the connection."""

        async def to_server() -> None:
            async for data in frames.drain(frames.upgrade):
                exchange.writer.write(data)
                await exchange.writer.drain()
            if exchange.writer.can_write_eof():
                exchange.writer.write_eof()  # the client half-closed

        outbound = asyncio.create_task(to_server(), name="k8s-proxy-upgrade-out")
        try:
            while data := await exchange.reader.read(MAX_CHUNK):
                await send(_Response(upgradeData=_Response.UpgradeData(data=data)))
                if outbound.done() and not outbound.cancelled() and outbound.exception() is not None:
                    break
        finally:
            outbound.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await outbound
