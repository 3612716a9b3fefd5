"""The browser sign-in for workspaces, kas' two steps of it (``rpc/tokens.py`` has the whole flow).

:meth:`SignIn.start` sends a browser without a session to the hub's sign-in for workspaces, with the state cookie
set on the workspace's origin. :meth:`SignIn.finish` takes the hub's code at the callback and sets the session
cookie. The session cookie is ``HttpOnly``, ``SameSite=Lax``, ``Secure`` when users reach kas over ``https``;
in the host form it is scoped to the zone (``Domain=<zone>``: one sign-in serves every workspace of the zone),
in the path form to kas' host and ``/-/workspaces/``. It lives as long as the hub session it stands for.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlencode

from aiohttp import web

from tether.modules.workspace_access import CALLBACK_PATH, PATH_PREFIX, SESSION_COOKIE, STATE_COOKIE
from tether.modules.workspace_access.rpc.tokens import (
    AUTHORIZE_REQUEST_LIFETIME_S,
    AuthorizeRequest,
    SignInCode,
    WorkspaceSession,
    new_nonce,
    nonce_digest,
    nonce_matches,
)
from tether.modules.workspace_access.server.addresses import WorkspaceAddress
from tether.modules.workspace_access.server.pages import error_response
from tether.tool.jwt_auth import JwtError

__all__ = ["SignIn"]

log = logging.getLogger(__name__)


class SignIn:
    """Both of kas' steps of the sign-in.

    Args:
        secret: the gitlab secret (shared with the hub) that signs the three tokens.
        sign_in_url: the hub's sign-in for workspaces as browsers reach it.
    """

    def __init__(self, secret: bytes, sign_in_url: str) -> None:
        self._secret = secret
        self._sign_in_url = sign_in_url

    def start(self, address: WorkspaceAddress, stale_cookie: bool) -> web.Response:
        """Redirect (302) to the hub, with a new state cookie; a stale session cookie is cleared."""
        nonce = new_nonce()
        request = AuthorizeRequest(address.origin + CALLBACK_PATH, address.request_target, nonce_digest(nonce))
        location = f"{self._sign_in_url}?{urlencode({'request': request.mint(self._secret)})}"
        response = web.Response(status=302, headers={"Location": location, "Cache-Control": "no-store"})
        response.set_cookie(
            STATE_COOKIE,
            nonce,
            path=CALLBACK_PATH,
            max_age=int(AUTHORIZE_REQUEST_LIFETIME_S),
            secure=address.scheme == "https",
            httponly=True,
            samesite="Lax",
        )
        if stale_cookie:
            self.clear_session(response, address)
        return response

    def finish(self, request: web.BaseRequest, address: WorkspaceAddress) -> web.Response:
        """Check the hub's code against the browser's state cookie, set the session cookie, go back (302).

        Answers 400 (a page saying to open the workspace again) when the code is missing, invalid, expired,
        issued for another origin, or the state cookie is missing or another browser's.
        """
        codes = request.rel_url.query.getall("code", [])
        nonce = request.cookies.get(STATE_COOKIE, "")
        try:
            if len(codes) != 1:
                raise JwtError("exactly one code is needed")
            code = SignInCode.read(codes[0], self._secret)
        except JwtError as exc:
            log.info("workspace sign-in callback refused: %s", exc)
            return self._refuse(request, address, "the sign-in link is invalid or has expired")
        if code.request.callback_url != address.origin + CALLBACK_PATH:
            log.info("workspace sign-in callback refused: the code was issued for another address")
            return self._refuse(request, address, "the sign-in was issued for another address")
        if not nonce or not nonce_matches(nonce, code.request.nonce_sha256):
            log.info("workspace sign-in callback refused: the state cookie is missing or another sign-in's")
            return self._refuse(request, address, "the sign-in was started in another browser or has expired")
        now = time.time()
        if code.session_expires_at <= now:
            return self._refuse(request, address, "the hub session has expired")
        cookie = WorkspaceSession(code.user_id, code.session_id, code.session_expires_at).mint(self._secret, now)
        response = web.Response(
            status=302, headers={"Location": _local(code.request.return_to), "Cache-Control": "no-store"}
        )
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            domain=address.zone,
            path="/" if address.zone is not None else PATH_PREFIX,
            max_age=max(int(code.session_expires_at - now), 1),
            secure=address.scheme == "https",
            httponly=True,
            samesite="Lax",
        )
        response.del_cookie(STATE_COOKIE, path=CALLBACK_PATH)
        log.info("workspace session started for user %d (hub session %d)", code.user_id, code.session_id)
        return response

    @staticmethod
    def clear_session(response: web.StreamResponse, address: WorkspaceAddress) -> None:
        """Make the browser drop its workspace session cookie."""
        path = "/" if address.zone is not None else PATH_PREFIX
        response.del_cookie(SESSION_COOKIE, domain=address.zone, path=path)

    def _refuse(self, request: web.BaseRequest, address: WorkspaceAddress, why: str) -> web.Response:
        response = error_response(
            request, 400, "Sign-in failed", f"Signing in to the workspace failed: {why}. Open the workspace again."
        )
        response.del_cookie(STATE_COOKIE, path=CALLBACK_PATH)
        return response


def _local(target: str) -> str:
    # Browsers read "/\\host" like "//host": only a plain path may follow a sign-in, else the page goes home.
    if not target.startswith("/") or target[1:2] in ("/", "\\") or "\\" in target or not target.isprintable():
        return "/"
    return target
