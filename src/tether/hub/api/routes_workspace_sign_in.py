"""``GET /-/workspaces/authorize``: the hub's step of the workspaces' browser sign-in (issue 13).

kas sends a browser here with a request it signed (``request``: callback URL on the workspace's origin, where to
return, the digest of the browser's state nonce; ``tether.modules.workspace_access.rpc.tokens``). A browser
without a hub session is sent to ``/users/sign_in`` and comes back here once signed in; a signed-in one is sent
to the callback with a one-minute code naming the user and the hub session. Only kas can sign a request, and kas
signs only its own callbacks, so the hub never redirects anywhere else.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Cookie, Query, Request, Response
from fastapi.responses import RedirectResponse

from tether.hub.api import session_pages
from tether.hub.api.browser import REDIRECT_FIELD, SESSION_COOKIE
from tether.hub.api.deps import State
from tether.hub.errors import Unauthorized
from tether.hub.service import sessions
from tether.modules.workspace_access import HUB_SIGN_IN_PATH
from tether.modules.workspace_access.rpc.tokens import AuthorizeRequest, SignInCode
from tether.tool.jwt_auth import JwtError

router = APIRouter(tags=["browser sessions"])
_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


@router.get(HUB_SIGN_IN_PATH, summary="Sign a browser in to its workspaces (kas redirects here)")
async def authorize_workspaces(
    request: Request,
    state: State,
    kas_request: Annotated[str | None, Query(alias="request", description="The request kas signed.")] = None,
    session_id: Annotated[str | None, Cookie(alias=SESSION_COOKIE)] = None,
) -> Response:
    """302 to the workspace's callback with ``code``; 303 to the sign-in form first without a hub session.

    400 (a page) when ``request`` is missing, expired or not signed by kas.
    """
    try:
        asked = AuthorizeRequest.read(kas_request or "", state.gitlab_secret)
    except JwtError:
        body = session_pages.sign_in_form(
            error="This workspace sign-in link is invalid or has expired. Open the workspace again."
        )
        return session_pages.page(body, 400)
    async with state.db.transaction() as session:
        try:
            active = await sessions.active_session(session, session_id or "")
        except Unauthorized:
            active = None
    if active is None:
        back = f"{request.url.path}?{urlencode({'request': kas_request})}"
        return RedirectResponse(f"/users/sign_in?{urlencode({REDIRECT_FIELD: back})}", 303, headers=_NO_STORE)
    code = SignInCode(active.user.id, active.row.id, int(active.row.expires_at.timestamp()), asked)
    separator = "&" if "?" in asked.callback_url else "?"
    location = asked.callback_url + separator + urlencode({"code": code.mint(state.gitlab_secret)})
    return RedirectResponse(location, 302, headers=_NO_STORE)
