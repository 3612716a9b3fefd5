"""aiohttp servers that never log or echo a malformed request (issue 9 item 7).

aiohttp's parser refuses a control character in a header value, an over-long line, a bad request line; its
default error handler then logs the offending line with a traceback and sends it back in the 400 body. That
line may be ``Authorization: Bearer <token>`` or a session cookie, so every HTTP listener of Tether is built
with :class:`SafeServer` (low-level) or :class:`SafeAppRunner` (an ``Application``): a malformed request gets
a fixed 400 body and a log line naming only the error's type and the peer.

Every answer of these servers also gets the headers a browser needs (issue 27 item 8), in one place, unless
the answer set its own: kas' own answers (errors, pages, metrics, the malformed request's 400) get
:data:`OWN_HEADERS`; an answer relayed from the cluster or a workspace (a :class:`RelayedResponse`) gets
what its listener passes as ``relayed_headers``: the Kubernetes API proxy frames nothing and sniffs nothing,
while a workspace's own answers pass unchanged (an editor frames its own pages and serves its own scripts).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

__all__ = [
    "MALFORMED_REQUEST_BODY",
    "OWN_HEADERS",
    "RELAYED_API_HEADERS",
    "RelayedResponse",
    "SafeAppRunner",
    "SafeServer",
    "start_site",
]

log = logging.getLogger(__name__)

#: The whole 400 body for a request aiohttp cannot parse.
MALFORMED_REQUEST_BODY = "400 Bad Request: malformed request line or header (e.g. a control character)\n"


#: kas' own answers: never sniffed or framed, their URLs never passed on as referrers; as documents they load nothing.
OWN_HEADERS: Mapping[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}
#: Answers relayed from the Kubernetes API: never sniffed or framed (a service proxy's page may load its own).
RELAYED_API_HEADERS: Mapping[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


class RelayedResponse(web.StreamResponse):
    """An answer whose head comes from the cluster or a workspace (its listener's ``relayed_headers`` apply)."""


def _complete(response: web.StreamResponse, defaults: Mapping[str, str]) -> None:
    for name, value in defaults.items():
        response.headers.setdefault(name, value)


class _SafeRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # Answered before any route matched (an Application's signals do not run): the headers are added here.
        if not isinstance(exc, HttpProcessingError):
            response = super().handle_error(request, status, exc, message)
            _complete(response, OWN_HEADERS)
            return response
        # The exception's text quotes the raw request bytes: log and answer without it.
        log.info("malformed HTTP request from %s refused: %s", request.remote, type(exc).__name__)
        response = web.Response(status=400, text=MALFORMED_REQUEST_BODY, headers=OWN_HEADERS)
        response.force_close()
        return response


class SafeServer(web.Server):
    """``aiohttp.web.Server`` with the redacting error handler and the security headers (module docstring).

    Args:
        handler: ``async (request) -> response``.
        relayed_headers: what a :class:`RelayedResponse` gets (nothing by default); kas' own answers get
            :data:`OWN_HEADERS`.
        kwargs: ``aiohttp.web.Server``'s; a ``request_factory`` given there (an ``Application``'s) keeps its
            own hooks, and the runner adds the headers (:class:`SafeAppRunner`).
    """

    def __init__(self, handler: Any, *, relayed_headers: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        relayed = dict(relayed_headers or {})

        class _Request(web.BaseRequest):
            async def _prepare_hook(self, response: web.StreamResponse) -> None:
                _complete(response, relayed if isinstance(response, RelayedResponse) else OWN_HEADERS)
                await super()._prepare_hook(response)

        def make_request(
            message: Any, payload: Any, protocol: RequestHandler, writer: Any, task: asyncio.Task[None]
        ) -> web.BaseRequest:
            return _Request(message, payload, protocol, writer, task, self._loop)

        kwargs.setdefault("request_factory", make_request)
        super().__init__(handler, **kwargs)

    def __call__(self) -> RequestHandler:
        """A protocol handler for one new connection."""
        return _SafeRequestHandler(self, loop=self._loop, **self._kwargs)


#: Idle keep-alive connections of a relaying listener are closed after this many seconds (upstream's idle
#: timeout, kas.md §5.1).
RELAY_IDLE_TIMEOUT_S = 60.0


def relay_server(handler: Any, relayed_headers: Mapping[str, str] | None = None) -> SafeServer:
    """A :class:`SafeServer` for a listener that relays requests through the tunnels (kas' proxies).

    Args:
        handler: ``async (request) -> response``.
        relayed_headers: the security headers relayed answers get (:class:`SafeServer`).

    Bodies are relayed as sent (no decompression); a client that goes away cancels its handler (and so its
    routed call); request lines are bounded to 16 KiB and header fields to 64 KiB; no aiohttp access log (URLs
    may carry sign-in codes).
    """
    return SafeServer(
        handler,
        relayed_headers=relayed_headers,
        handler_cancellation=True,
        auto_decompress=False,
        keepalive_timeout=RELAY_IDLE_TIMEOUT_S,
        max_line_size=16 * 1024,
        max_field_size=64 * 1024,
        access_log=None,
    )


class SafeAppRunner(web.AppRunner):
    """``aiohttp.web.AppRunner`` serving the application through a :class:`SafeServer` (same arguments)."""

    async def _make_server(self) -> web.Server:
        async def complete(_request: web.Request, response: web.StreamResponse) -> None:
            _complete(response, OWN_HEADERS)

        self.app.on_response_prepare.append(complete)  # before the start-up freezes the signals
        plain = await super()._make_server()  # runs the application's start-up
        return SafeServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=plain._loop,
            **plain._kwargs,
        )


async def start_site(
    runner: web.BaseRunner, network: str, address: str, certificate_file: Path | None, key_file: Path | None
) -> int:
    """Set ``runner`` up and serve it on one listener; return the bound TCP port (0 for a unix socket).

    Args:
        runner: the server's runner (cleaned up again when binding fails).
        network: ``tcp`` or ``unix``.
        address: ``host:port`` (``[v6]:port``, an empty host for every address) or a socket path.
        certificate_file: serving certificate (PEM); TLS when it and ``key_file`` are given.
        key_file: its private key (PEM).

    Raises:
        OSError: the address cannot be bound.
        ssl.SSLError: the certificate or key cannot be loaded.
    """
    await runner.setup()
    site: web.BaseSite
    if network == "unix":
        site = web.UnixSite(runner, address)
    else:
        context = None
        if certificate_file is not None and key_file is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certificate_file, key_file)
        host, _, port = address.rpartition(":")
        site = web.TCPSite(runner, host.strip("[]") or None, int(port), ssl_context=context)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    addresses = runner.addresses
    return int(addresses[0][1]) if addresses and isinstance(addresses[0], tuple) else 0
