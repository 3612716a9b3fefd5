"""The headers a browser needs on every answer of the hub (issue 27 item 8), added in one place.

Each answer gets, unless its route set its own (the console's and the sign-in pages' stricter ones stay):

* ``X-Content-Type-Options: nosniff``: a browser never runs an answer as another type than it says (a JSON
  error or a static file as a script or a page);
* ``X-Frame-Options: DENY`` and ``Content-Security-Policy`` with ``frame-ancestors 'none'``: no page of the hub
  is framed by another site (clickjacking). Answers that are not HTML also get ``default-src 'none'``: opened
  as a document, they may load nothing. HTML pages without a policy of their own (FastAPI's ``/docs``, which
  loads its scripts from a CDN) get only ``frame-ancestors``;
* ``Referrer-Policy: same-origin``: the hub's URLs (paths, ``redirect_to`` and sign-in parameters) are never
  sent to another site.

Unhandled errors are answered outside every middleware by Starlette's last-resort handler: :func:`install`
gives that answer the same headers.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SECURITY_HEADERS", "SecurityHeadersMiddleware", "install"]

#: Every answer's defaults (a route's own value wins); the policy of answers that are not HTML.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "same-origin",
}
#: The policy of HTML pages that bring none of their own.
_HTML_POLICY = "frame-ancestors 'none'"


def _add_defaults(headers: MutableHeaders) -> None:
    html = headers.get("content-type", "").startswith("text/html")
    for name, value in SECURITY_HEADERS.items():
        headers.setdefault(name, _HTML_POLICY if html and name == "Content-Security-Policy" else value)


class SecurityHeadersMiddleware:
    """ASGI middleware adding :data:`SECURITY_HEADERS` to each HTTP answer's head (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; complete the answer's head on its way out."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return

        async def complete(message: Message) -> None:
            if message["type"] == "http.response.start":
                _add_defaults(MutableHeaders(scope=message))
            await send(message)

        await self._app(scope, receive, complete)


async def _internal_error(_request: Request, _exc: Exception) -> JSONResponse:
    # Starlette raises the error again once this is sent, and uvicorn logs it with its traceback.
    response = JSONResponse({"message": "500 Internal Server Error"}, status_code=500)
    _add_defaults(response.headers)
    return response


def install(app: FastAPI) -> None:
    """Add the middleware, and the same headers to the last-resort 500 answer."""
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_exception_handler(Exception, _internal_error)
