"""kas side of HTTP over gRPC: one HTTP request received by kas, carried to an agent as a ``MakeRequest`` call.

Used by every kas module that forwards HTTP to its agent (``kubernetes_api``, ``workspace_access``; kas.md §5.2,
§5.3). The module builds the ``header`` frame (its own rules: which headers and query parameters go, what
``extra`` carries) and calls its agent with :meth:`ProxyCall.requests` as the request stream: ``header``,
``data`` chunks of at most 32 KiB as the body arrives, ``trailer`` and, after a ``101``, ``upgradeData`` with
whatever the client sends. :meth:`ProxyCall.relay` writes the agent's ``HttpResponse`` frames to the client as
they arrive, their order checked by the automaton of the ``.proto`` options: the head, then each ``data``
chunk at once (so ``watch`` events flow live), or, after a ``101``, raw bytes on the taken-over connection
(``hijack.py``).

Unlike upstream (whose Go handler cannot read and write at once, §5.3 step 4), the request body and the
response are relayed concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Protocol

from aiohttp import web

from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.http_grpc.headers import HeaderMap, clean_headers, from_values, via_value
from tether.tool.http_grpc.hijack import RawConnection, hijack
from tether.tool.http_server import RelayedResponse

__all__ = ["MAX_CHUNK", "ProxyCall", "ResponseStreamError", "UpgradeTap", "content_length_of"]

log = logging.getLogger(__name__)

#: Largest ``data`` / ``upgradeData`` payload in bytes (kas.md §5.3 step 4).
MAX_CHUNK = 32 * 1024
_HttpRequest = grpctool_pb2.HttpRequest


class UpgradeTap(Protocol):
    """Sees the bytes of an upgraded connection as they are relayed (a session recorder); must not block."""

    def upgraded(self, headers: HeaderMap) -> None:
        """The ``101`` answer's headers (canonical names)."""

    def client(self, data: bytes) -> None:
        """Bytes the client sent, before they go to the agent."""

    def server(self, data: bytes) -> None:
        """Bytes the agent sent, before they go to the client."""


class ResponseStreamError(Exception):
    """agentk's response frames are out of order, or not a valid HTTP response."""


def content_length_of(request: web.BaseRequest) -> int:
    """``Header.content_length`` for ``request``: -1 chunked, 0 no body, else the ``Content-Length`` in bytes."""
    if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        return -1
    length = request.content_length
    return length if length is not None else 0


def _reason(status: str, code: int) -> str | None:
    # prototool.HttpResponse.status is Go's "200 OK"; aiohttp wants the phrase alone.
    phrase = status.removeprefix(str(code)).strip()
    return phrase if phrase and "\r" not in phrase and "\n" not in phrase else None


class ProxyCall:
    """One proxied request: its request frames for the agent call, the agent's response frames to the client.

    Args:
        request: the client's request.
        header: its ``header`` frame.
        upgrade: whether the request asks for an HTTP upgrade.
        extra_headers: headers kas adds to the response (CORS); upstream values never override them.
        response_filter: rewrites the upstream response headers (canonical names, hop-by-hop removed) before
            they are sent, e.g. to drop some ``Set-Cookie``; None keeps them.
        tap: sees the upgraded connection's bytes both ways (issue 25 item 2), or None.
    """

    def __init__(
        self,
        request: web.BaseRequest,
        header: _HttpRequest,
        upgrade: bool,
        extra_headers: dict[str, str],
        response_filter: Callable[[HeaderMap], HeaderMap] | None = None,
        tap: UpgradeTap | None = None,
    ) -> None:
        self._request = request
        self._header: _HttpRequest | None = header
        self._body_left = header.header.content_length != 0
        self._body_done = False
        self._upgrade = upgrade
        self._extra = extra_headers
        self._response_filter = response_filter
        self._tap = tap
        self._expect_continue = request.headers.get("Expect", "").lower() == "100-continue"
        self._automaton = StreamAutomaton(grpctool_pb2.HttpResponse)
        self._head_known = asyncio.Event()
        self._pending = b""
        self.response: web.StreamResponse | None = None
        self.raw: RawConnection | None = None
        self.complete = False
        #: Body and upgraded-stream bytes relayed: client -> agent, agent -> client (an audit byte counter).
        self.bytes_in = 0
        self.bytes_out = 0
        #: The status of the response head sent to the client; 0 before.
        self.status_sent = 0

    @property
    def extra_headers(self) -> dict[str, str]:
        """Headers kas adds to every answer to this request (CORS)."""
        return self._extra

    def abort(self) -> None:
        """Cut the client connection: a response whose head is out cannot report an error otherwise."""
        if self.response is not None:
            self.response.force_close()
        if self.raw is not None:
            self.raw.close()
        transport = self._request.transport
        if transport is not None:
            transport.close()

    async def wait_head(self) -> None:
        """Return once the response head was sent to the client."""
        await self._head_known.wait()

    @property
    def head_sent(self) -> bool:
        """Whether the response head went to the client (errors can then only cut the connection)."""
        return self.response is not None

    # ---- request frames ---------------------------------------------------------------------------

    async def requests(self) -> AsyncIterator[_HttpRequest]:
        """The request stream: ``header``, the body as ``data``, ``trailer``, then ``upgradeData`` after a ``101``.

        A body that fails to arrive (connection lost, malformed chunked framing) ends the stream without its
        trailer, so the agent does not mistake it for a whole one.
        """
        header, self._header = self._header, None
        if header is None:
            return
        yield header
        while (frame := await self._next_frame()) is not None:
            yield frame

    async def _next_frame(self) -> _HttpRequest | None:
        if not self._body_done:
            return await self._read_body()
        if not self._upgrade:
            return None
        return await self._read_upgraded()

    async def _read_body(self) -> _HttpRequest | None:
        if self._body_left:
            if self._expect_continue:
                self._expect_continue = False
                await self._request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                chunk = await self._request.content.read(MAX_CHUNK)
            except Exception as exc:  # connection lost, malformed chunked framing, ...
                log.debug("reading the request body failed: %r", exc)
                self._body_done = True
                return None
            if chunk:
                self.bytes_in += len(chunk)
                return _HttpRequest(data=_HttpRequest.Data(data=chunk))
        self._body_done = True
        return _HttpRequest(trailer=_HttpRequest.Trailer())

    async def _read_upgraded(self) -> _HttpRequest | None:
        await self._head_known.wait()
        if self.raw is None:
            return None  # not switched: half-close
        if not self._pending:
            data = await self.raw.read()
            if data is None:
                return None
            if self._tap is not None:
                self._tap.client(data)
            self._pending = data
        chunk, self._pending = self._pending[:MAX_CHUNK], self._pending[MAX_CHUNK:]
        self.bytes_in += len(chunk)
        return _HttpRequest(upgradeData=_HttpRequest.UpgradeData(data=chunk))

    # ---- response frames --------------------------------------------------------------------------

    async def relay(self, responses: AsyncIterable[grpctool_pb2.HttpResponse]) -> None:
        """Write the agent's response frames to the client as they arrive; check :attr:`complete` after.

        Raises:
            ResponseStreamError: a frame out of order, or an invalid head.
            ConnectionError: the client is gone.
            Exception: whatever iterating ``responses`` raised (the agent call's failure).
        """
        async for message in responses:
            await self._relay_one(message)

    async def _relay_one(self, message: grpctool_pb2.HttpResponse) -> None:
        try:
            kind = self._automaton.visit(message)
        except StreamOrderError as exc:
            raise ResponseStreamError(f"invalid response frame from the agent: {exc}") from exc
        if kind == "header":
            await self._start(message.header.response)
        elif kind == "data":
            assert self.response is not None
            self.bytes_out += len(message.data.data)
            await self.response.write(message.data.data)
        elif kind == "trailer":
            self.complete = True
            if self.raw is None:
                assert self.response is not None
                await self.response.write_eof()
        elif kind == "upgradeData":
            if self.raw is None:
                raise ResponseStreamError("the agent sent upgrade data without switching protocols")
            if self._tap is not None:
                self._tap.server(message.upgradeData.data)
            self.bytes_out += len(message.upgradeData.data)
            await self.raw.write(message.upgradeData.data)

    async def _start(self, head: prototool_pb2.HttpResponse) -> None:
        code = head.status_code
        switching = code == 101
        if switching and not self._upgrade:
            raise ResponseStreamError("the agent switched protocols for a request that asked for no upgrade")
        if code < 200 and not switching:
            raise ResponseStreamError(f"the agent sent an informational status {code} as the response")
        upstream = clean_headers(from_values(head.header))
        if self._extra:
            # kas answers CORS itself (kas.md §5.3 step 5): the cluster's CORS headers are dropped.
            upstream = {k: v for k, v in upstream.items() if not k.lower().startswith("access-control-")}
        if self._response_filter is not None:
            upstream = self._response_filter(upstream)
        response = RelayedResponse(status=code, reason=_reason(head.status, code))
        for key, value in self._extra.items():
            response.headers[key] = value
        for key, values in upstream.items():
            if key in response.headers and key != "Vary":
                continue
            for value in values:
                response.headers.add(key, value)
        response.headers.add("Via", via_value("gRPC/1.0", "gitlab-kas"))
        try:
            await response.prepare(self._request)
        except ValueError as exc:  # a header aiohttp refuses to send
            raise ResponseStreamError(f"invalid response head from the agent: {exc}") from exc
        self.response = response
        self.status_sent = code
        if switching:
            # No await between the 101 write above and the takeover (hijack.py).
            self.raw = hijack(self._request)
            if self._tap is not None:
                self._tap.upgraded(upstream)
        self._head_known.set()
