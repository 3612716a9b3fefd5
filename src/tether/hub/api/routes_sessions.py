"""Browser sessions: ``/users/sign_in``, ``/users/session``, ``/users/sign_out`` (outside ``/api/v4``, as GitLab).

A session signed in here is what kas' ``session_cookie`` credential refers to (kas.md §4.5): the browser sends
kas the ``_gitlab_kas`` cookie and the session's CSRF token, kas asks ``authorize_proxy_user``. See
:mod:`tether.hub.api.browser` for the cookies and :mod:`tether.hub.service.sessions` for the rules.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Cookie, Header, Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.api import session_pages
from tether.hub.api.browser import (
    CSRF_FIELD,
    CSRF_HEADER,
    REDIRECT_FIELD,
    SESSION_COOKIE,
    check_same_origin,
    clear_session_cookies,
    is_form,
    local_redirect,
    read_form,
    set_session_cookies,
)
from tether.hub.api.deps import State
from tether.hub.errors import Forbidden, TooManyRequests, Unauthorized
from tether.hub.service import sessions

router = APIRouter(prefix="/users", tags=["browser sessions"])
SessionCookie = Annotated[
    str | None, Cookie(alias=SESSION_COOKIE, description="The session id set by POST /users/sign_in.")
]


class SessionOut(BaseModel):
    """``GET /users/session``."""

    username: str
    csrf_token: str = Field(description="For X-Csrf-Token (or gitlab-csrf-token) on the Kubernetes API proxy.")


async def _live(session: AsyncSession, session_id: str | None) -> sessions.ActiveSession | None:
    try:
        return await sessions.active_session(session, session_id or "")
    except Unauthorized:
        return None


@router.get("/sign_in", response_class=HTMLResponse, summary="The sign-in form")
async def sign_in_form(
    state: State,
    session_id: SessionCookie = None,
    redirect_to: Annotated[str | None, Query(description="A path on this hub to go to once signed in.")] = None,
) -> Response:
    """The form; a browser already signed in goes to ``redirect_to`` (303), or gets the signed-in page."""
    target = local_redirect(redirect_to)
    async with state.db.transaction() as session:
        active = await _live(session, session_id)
    if active is not None:
        if target:
            return RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
        return session_pages.page(
            session_pages.signed_in(active.user.username, active.csrf_token, active.row.expires_at)
        )
    return session_pages.page(session_pages.sign_in_form(redirect_to=target))


@router.post("/sign_in", response_class=HTMLResponse, summary="Sign in with a username and a personal access token")
async def sign_in(request: Request, state: State, session_id: SessionCookie = None) -> Response:
    """Sign in with form fields ``login``, ``token`` and optionally ``redirect_to``.

    ``login`` is the username, ``token`` a personal access token with scope ``api`` or ``k8s_proxy``,
    ``redirect_to`` a path on this hub. 200: the signed-in page (303 to ``redirect_to`` when given), with
    ``Set-Cookie`` for ``_gitlab_session`` and ``_gitlab_kas``; a session this browser already had is ended.
    401: the form again with ``Invalid login or token.``; 400: a field is empty or the body is not a form; 403:
    posted from another origin; 429: too many failed sign-ins from this address.
    """
    check_same_origin(request, state.config)
    form = await read_form(request)
    login, token = form.get("login", "").strip(), form.get("token", "").strip()
    target = local_redirect(form.get(REDIRECT_FIELD))
    if not login or not token:
        html = session_pages.sign_in_form(
            error="Enter your username and a personal access token.", login=login, redirect_to=target
        )
        return session_pages.page(html, 400)
    try:
        await state.throttle.check(request)
    except TooManyRequests as exc:
        page = session_pages.page(session_pages.sign_in_form(error=str(exc), login=login, redirect_to=target), 429)
        page.headers.update(exc.headers)
        return page
    try:
        async with state.db.transaction() as session:
            previous = await _live(session, session_id)
            if previous is not None:
                await sessions.sign_out(session, previous)
            active = await sessions.sign_in(session, login, token, state.config.sessions.lifetime)
    except Unauthorized as exc:
        await state.throttle.failed(request)
        return session_pages.page(session_pages.sign_in_form(error=str(exc), login=login, redirect_to=target), 401)
    response: Response
    if target:
        response = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    else:
        response = session_pages.page(
            session_pages.signed_in(active.user.username, active.csrf_token, active.row.expires_at)
        )
    set_session_cookies(response, active.session_id, state.config)
    return response


@router.get("/session", summary="The signed-in user and the session's CSRF token")
async def current_session(response: Response, state: State, session_id: SessionCookie = None) -> SessionOut:
    """For scripts holding the ``_gitlab_session`` cookie. 401 without a live session (the message says why)."""
    async with state.db.transaction() as session:
        active = await sessions.active_session(session, session_id or "")
    response.headers["Cache-Control"] = "no-store"
    return SessionOut(username=active.user.username, csrf_token=active.csrf_token)


@router.post("/sign_out", response_class=HTMLResponse, summary="End the session")
async def sign_out(
    request: Request,
    state: State,
    session_id: SessionCookie = None,
    csrf_header: Annotated[str | None, Header(alias=CSRF_HEADER, description="The session's CSRF token.")] = None,
) -> HTMLResponse:
    """Delete the session and clear both cookies; then the sign-in form.

    The session's CSRF token must come in ``X-Csrf-Token`` or the form field ``authenticity_token``: otherwise
    403 and the session stays. Without a live session there is nothing to end: the cookies are cleared anyway.
    """
    check_same_origin(request, state.config)
    form = await read_form(request) if is_form(request) else {}
    csrf_token = csrf_header or form.get(CSRF_FIELD, "")
    async with state.db.transaction() as session:
        active = await _live(session, session_id)
        if active is not None:
            try:
                sessions.check_csrf(active, csrf_token)
            except Unauthorized:
                raise Forbidden("403 Forbidden - the CSRF token is missing or is not this session's") from None
            await sessions.sign_out(session, active)
    response = session_pages.page(session_pages.sign_in_form(notice="You are signed out."))
    clear_session_cookies(response, state.config)
    return response
