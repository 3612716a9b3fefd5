"""The JWT gate in front of the internal API, checked before anything else about the request (body included).

kas signs ``Gitlab-Kas-Api-Request`` with ``iss=gitlab-kas``, ``aud=gitlab`` and the shared secret (kas.md §4.4).
A route-level dependency would run after FastAPI parsed the body, so a malformed body without a JWT would get
400 instead of 401; this ASGI middleware answers 401 first.
"""

from __future__ import annotations

import json

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.hub.api.state import HubState
from tether.hub.db.engine import kas_lane
from tether.tool.jwt_auth import JwtError, RecentTokens

INTERNAL_PREFIX = "/api/v4/internal/"
JWT_HEADER = "Gitlab-Kas-Api-Request"


def check_kas_jwt(token: str | None, tokens: RecentTokens) -> str | None:
    """None when ``token`` is a valid kas JWT, else the reason (for the 401 message)."""
    if not token:
        return f"{JWT_HEADER} header is missing"
    try:
        tokens.check(token)
    except JwtError as exc:
        return f"{JWT_HEADER} JWT validation failed: {exc}"
    return None


_CHECKED = "tether.kas_jwt_checked"


def kas_jwt_checked(scope: Scope) -> bool:
    """Whether :class:`KasJwtMiddleware` accepted this request's kas JWT."""
    return bool(scope.get("state", {}).get(_CHECKED))


class KasJwtMiddleware:
    """ASGI middleware: 401 ``{"message": ...}`` for internal calls without a valid kas JWT."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check internal calls; pass everything else through."""
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(INTERNAL_PREFIX):
            state: HubState = scope["app"].state.hub
            problem = check_kas_jwt(Headers(scope=scope).get(JWT_HEADER), state.kas_jwt)
            if problem is not None:
                body = json.dumps({"message": f"401 Unauthorized - {problem}"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
            scope.setdefault("state", {})[_CHECKED] = True
            with kas_lane():  # kas' calls draw from their own connection pool (issue 27 item 3)
                await self._app(scope, receive, send)
            return
        await self._app(scope, receive, send)
