"""Keep URL-encoded slashes inside one path segment (``/projects/group%2Fproject/...``).

ASGI servers decode the path before routing, which would turn ``group%2Fproject`` into two segments. This
middleware rebuilds the path from ``raw_path``, decoding each segment but keeping a decoded ``/`` as ``%2F``, so
the router sees one segment and :func:`tether.hub.api.deps.ref` decodes it. GitLab identifies projects and groups
this way ("REST API: Namespaced paths").
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.types import ASGIApp, Receive, Scope, Send


class EncodedPathMiddleware:
    """ASGI middleware; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Rewrite ``scope["path"]`` when the raw path has an encoded slash."""
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and b"%2f" in raw.lower():
            text = raw.decode("latin-1").split("?", 1)[0]
            path = "/".join(unquote(segment).replace("/", "%2F") for segment in text.split("/"))
            scope = dict(scope, path=path)
        await self._app(scope, receive, send)
