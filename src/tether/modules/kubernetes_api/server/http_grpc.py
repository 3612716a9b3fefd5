"""kas side of HTTP over gRPC: one proxied HTTP request as the routed ``MakeRequest`` call (kas.md §5.2, §5.3).

The request becomes ``header`` (method, cleaned headers, path without the proxy prefix, query without
kas' own parameters, body size, impersonation in ``extra``), ``data`` chunks of at most 32 KiB as the body
arrives, ``trailer`` and, after a ``101``, ``upgradeData`` with whatever the client sends. The response
frames are validated against the declared ``HttpResponse`` order and written to the client as they
arrive: the head, then each ``data`` chunk at once (so ``watch`` events flow live), or, after a ``101``,
raw bytes on the taken-over connection (``upgrade.py``).

Unlike upstream (whose Go handler cannot read and write at once, §5.3 step 4), the request body and the
response are relayed concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiohttp import web
from google.protobuf.message import DecodeError

from tether.modules.kubernetes_api.rpc.headers import HeaderMap, clean_headers, from_values, to_values, via_value
from tether.modules.kubernetes_api.server.auth import AGENT_ID_HEADER, AGENT_ID_QUERY, CSRF_HEADER, CSRF_QUERY
from tether.modules.kubernetes_api.server.upgrade import RawConnection, hijack
from tether.pb.gitlab.agent.grpctool import grpctool_pb2
from tether.pb.gitlab.agent.kubernetes_api.rpc import rpc_pb2
from tether.pb.gitlab.agent.prototool import prototool_pb2
from tether.tool.automaton import StreamAutomaton, StreamOrderError
from tether.tool.http_server import RelayedResponse
from tether.tunnel.server.tunnel import ValuesMap

__all__ = [
    "MAKE_REQUEST",
    "MAX_CHUNK",
    "ProxyCall",
    "ResponseStreamError",
    "content_length_of",
    "request_header",
]

log = logging.getLogger(__name__)

#: The agent API that carries proxied requests (kas.md §5.2).
MAKE_REQUEST = "/gitlab.agent.kubernetes_api.rpc.KubernetesApi/MakeRequest"
#: Largest ``data`` / ``upgradeData`` payload in bytes (kas.md §5.3 step 4).
MAX_CHUNK = 32 * 1024
#: Request headers that carry kas' own credentials or were already handled by kas (kas.md §5.3 step 3).
_KAS_HEADERS = ("Authorization", "Cookie", AGENT_ID_HEADER, CSRF_HEADER, "Expect")
_KAS_QUERY = frozenset({AGENT_ID_QUERY, CSRF_QUERY})
_HttpRequest = grpctool_pb2.HttpRequest


class ResponseStreamError(Exception):
    """agentk's response frames are undecodable, out of order, or not a valid HTTP response."""


def content_length_of(request: web.BaseRequest) -> int:
    """``Header.content_length`` for ``request``: -1 chunked, 0 no body, else the ``Content-Length`` in bytes."""
    if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        return -1
    length = request.content_length
    return length if length is not None else 0


def request_header(
    request: web.BaseRequest, url_path: str, impersonation: rpc_pb2.ImpersonationConfig | None
) -> _HttpRequest:
    """The ``header`` frame for ``request``.

    Args:
        request: the client's request.
        url_path: its path with the proxy prefix stripped, e.g. ``/api/v1/pods``.
        impersonation: the identity to impose, or None to use the agent's own.
    """
    headers = clean_headers(request.headers.items(), drop=_KAS_HEADERS)
    headers.setdefault("Via", []).append(via_value("gRPC/1.0", "gitlab-kas"))
    query: HeaderMap = {}
    for key, value in request.rel_url.query.items():
        if key not in _KAS_QUERY:
            query.setdefault(key, []).append(value)
    header = _HttpRequest.Header(
        request=prototool_pb2.HttpRequest(
            method=request.method, header=to_values(headers), url_path=url_path, query=to_values(query)
        ),
        content_length=content_length_of(request),
    )
    if impersonation is not None:
        header.extra.Pack(rpc_pb2.HeaderExtra(imp_config=impersonation))
    return _HttpRequest(header=header)


def _reason(status: str, code: int) -> str | None:
    # prototool.HttpResponse.status is Go's "200 OK"; aiohttp wants the phrase alone.
    phrase = status.removeprefix(str(code)).strip()
    return phrase if phrase and "\r" not in phrase and "\n" not in phrase else None


class ProxyCall:
    """One proxied request, as the routing layer's ``CallerSide``.

    Args:
        request: the client's request.
        header: its ``header`` frame (:func:`request_header`).
        upgrade: whether the request asks for an HTTP upgrade.
        extra_headers: headers kas adds to the response (CORS); upstream values never override them.
        response_filter: rewrites the upstream response headers (canonical names, hop-by-hop removed) before
            they are sent, e.g. to drop some ``Set-Cookie``; None keeps them.
    """

    def __init__(
        self,
        request: web.BaseRequest,
        header: _HttpRequest,
        upgrade: bool,
        extra_headers: dict[str, str],
        response_filter: Callable[[HeaderMap], HeaderMap] | None = None,
    ) -> None:
        self._request = request
        self._header: bytes | None = header.SerializeToString()
        self._body_left = header.header.content_length != 0
        self._body_done = False
        self._upgrade = upgrade
        self._extra = extra_headers
        self._response_filter = response_filter
        self._expect_continue = request.headers.get("Expect", "").lower() == "100-continue"
        self._automaton = StreamAutomaton(grpctool_pb2.HttpResponse)
        self._head_known = asyncio.Event()
        self._pending = b""
        self.response: web.StreamResponse | None = None
        self.raw: RawConnection | None = None
        self.complete = False

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

    # ---- request frames (CallerSide.read) --------------------------------------------------------

    async def read(self) -> bytes | None:
        """Next serialized ``HttpRequest`` frame, or None when the request stream is complete."""
        if self._header is not None:
            header, self._header = self._header, None
            return header
        if not self._body_done:
            return await self._read_body()
        if not self._upgrade:
            return None
        return await self._read_upgraded()

    async def _read_body(self) -> bytes | None:
        if self._body_left:
            if self._expect_continue:
                self._expect_continue = False
                await self._request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                chunk = await self._request.content.read(MAX_CHUNK)
            except Exception as exc:  # connection lost, malformed chunked framing, ...
                # No trailer: the body is incomplete, and agentk must not mistake it for a whole one.
                log.debug("reading the request body failed: %r", exc)
                self._body_done = True
                return None
            if chunk:
                return _HttpRequest(data=_HttpRequest.Data(data=chunk)).SerializeToString()
        self._body_done = True
        return _HttpRequest(trailer=_HttpRequest.Trailer()).SerializeToString()

    async def _read_upgraded(self) -> bytes | None:
        await self._head_known.wait()
        if self.raw is None:
            return None  # not switched: half-close
        if not self._pending:
            data = await self.raw.read()
            if data is None:
                return None
            self._pending = data
        chunk, self._pending = self._pending[:MAX_CHUNK], self._pending[MAX_CHUNK:]
        return _HttpRequest(upgradeData=_HttpRequest.UpgradeData(data=chunk)).SerializeToString()

    # ---- response frames (CallerSide.send_header / write / set_trailer) --------------------------

    async def send_header(self, meta: ValuesMap) -> None:
        """Ignore agentk's gRPC headers: they are not part of the HTTP response."""

    async def set_trailer(self, meta: ValuesMap) -> None:
        """Ignore agentk's gRPC trailers: they are not part of the HTTP response."""

    async def write(self, data: bytes) -> None:
        """Relay one serialized ``HttpResponse`` frame to the client.

        Raises:
            ResponseStreamError: undecodable frame, wrong order, or an invalid head.
            ConnectionError: the client is gone.
        """
        try:
            message = grpctool_pb2.HttpResponse.FromString(data)
            kind = self._automaton.visit(message)
        except (DecodeError, StreamOrderError) as exc:
            raise ResponseStreamError(f"invalid response frame from the agent: {exc}") from exc
        if kind == "header":
            await self._start(message.header.response)
        elif kind == "data":
            assert self.response is not None
            await self.response.write(message.data.data)
        elif kind == "trailer":
            self.complete = True
            if self.raw is None:
                assert self.response is not None
                await self.response.write_eof()
        elif kind == "upgradeData":
            if self.raw is None:
                raise ResponseStreamError("the agent sent upgrade data without switching protocols")
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
        if switching:
            # No await between the 101 write above and the takeover (upgrade.py).
            self.raw = hijack(self._request)
        self._head_known.set()
