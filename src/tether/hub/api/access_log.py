"""One log line per request: method, path (never the query string, never headers), status, duration.

uvicorn's own access log is off: it would print query strings, where a careless client might put a token.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("tether.hub.access")


class AccessLogMiddleware:
    """ASGI middleware writing ``GET /api/v4/projects 200 3.1ms`` at INFO to ``tether.hub.access``."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Time the request and log its outcome."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500
        # kas sends the id of the request that caused this call (tether.tool.logs): one request, one id.
        request_id = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-request-id"), None)
        logged = False

        def write() -> None:
            nonlocal logged
            logged = True
            elapsed_ms = (time.monotonic() - started) * 1000.0
            extra = {"request_id": request_id[:64]} if request_id else {}
            log.info("%s %s %d %.1fms", scope["method"], scope["path"], status, elapsed_ms, extra=extra)

        async def record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Written before the last byte leaves: whoever holds the reply can count on its line.
                write()
            await send(message)

        try:
            await self._app(scope, receive, record)
        finally:
            if not logged:
                write()
