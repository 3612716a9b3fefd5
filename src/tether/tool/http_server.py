"""aiohttp servers that never log or echo a malformed request (issue 9 item 7).

aiohttp's parser refuses a control character in a header value, an over-long line, a bad request line; its
default error handler then logs the offending line with a traceback and sends it back in the 400 body. That
line may be ``Authorization: Bearer <token>`` or a session cookie, so every HTTP listener of Tether is built
with :class:`SafeServer` (low-level) or :class:`SafeAppRunner` (an ``Application``): a malformed request gets
a fixed 400 body and a log line naming only the error's type and the peer.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

__all__ = ["MALFORMED_REQUEST_BODY", "SafeAppRunner", "SafeServer", "start_site"]

log = logging.getLogger(__name__)

#: The whole 400 body for a request aiohttp cannot parse.
MALFORMED_REQUEST_BODY = "400 Bad Request: malformed request line or header (e.g. a control character)\n"


class _SafeRequestHandler(RequestHandler):
    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # The exception's text quotes the raw request bytes: log and answer without it.
        log.info("malformed HTTP request from %s refused: %s", request.remote, type(exc).__name__)
        response = web.Response(status=400, text=MALFORMED_REQUEST_BODY)
        response.force_close()
        return response


class SafeServer(web.Server):
    """``aiohttp.web.Server`` whose connections use the redacting error handler (same arguments)."""

    def __call__(self) -> RequestHandler:
        """A protocol handler for one new connection."""
        return _SafeRequestHandler(self, loop=self._loop, **self._kwargs)


#: Idle keep-alive connections of a relaying listener are closed after this many seconds (upstream's idle
#: timeout, kas.md §5.1).
RELAY_IDLE_TIMEOUT_S = 60.0


def relay_server(handler: Any) -> SafeServer:
    """A :class:`SafeServer` for a listener that relays requests through the tunnels (kas' proxies).

    Args:
        handler: ``async (request) -> response``.

    Bodies are relayed as sent (no decompression); a client that goes away cancels its handler (and so its
    routed call); request lines are bounded to 16 KiB and header fields to 64 KiB; no aiohttp access log (URLs
    may carry sign-in codes).
    """
    return SafeServer(
        handler,
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
