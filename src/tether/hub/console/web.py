"""What every console page needs: the templates, the signed-in user, CSRF checks and errors in plain words.

The console acts with the browser session the hub issues at ``/users/sign_in`` (cookie ``_gitlab_session``):
the session stands for its user, so the user has their roles but no token scopes. Every state-changing request
must carry the session's CSRF token (form field ``authenticity_token`` or header ``X-Csrf-Token``) and, when the
browser sends ``Origin``, come from the hub's own origin.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from tether.hub.api.browser import CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE, check_same_origin, read_form
from tether.hub.api.state import HubState, hub_state
from tether.hub.errors import BadRequest, Forbidden, HubError, NotFound, Unauthorized
from tether.hub.service import sessions
from tether.hub.service.principal import SCOPE_API, Principal

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
templates = Jinja2Templates(
    env=jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, auto_reload=False)
)
#: Pages may load scripts, styles and images from the hub only, and open WebSockets to it; never framed.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "Referrer-Policy": "same-origin",
}
#: Console forms are small, except the agent configuration (at most 128 KiB of YAML, form-encoded).
MAX_FORM_BYTES = 512 * 1024


class SignInRequired(Exception):
    """No live session: pages redirect to the sign-in form, htmx requests get ``HX-Redirect``."""


@dataclass(frozen=True)
class ConsoleUser:
    """The signed-in user of a console request.

    Attributes:
        principal: acts for the user in the service layer (their roles; a session has no token scopes, so it is
            given ``api`` as GitLab's UI acts with the user's full rights).
        username: shown in the header.
        csrf_token: the session's CSRF token, put in every form and in the graph page.
    """

    principal: Principal
    username: str
    csrf_token: str


async def console_user(request: Request) -> ConsoleUser:
    """The user behind the request's ``_gitlab_session`` cookie.

    Raises:
        SignInRequired: no cookie, or an unknown, signed-out or expired session, or a blocked user.
    """
    state = hub_state(request)
    async with state.db.transaction() as session:
        try:
            active = await sessions.active_session(session, request.cookies.get(SESSION_COOKIE, ""))
        except Unauthorized:
            raise SignInRequired() from None
    user = active.user
    principal = Principal(user_id=user.id, username=user.username, admin=user.admin, scopes=frozenset({SCOPE_API}))
    return ConsoleUser(principal=principal, username=user.username, csrf_token=active.csrf_token)


async def checked_form(request: Request, user: ConsoleUser) -> dict[str, str]:
    """The fields of a state-changing console request, after the origin and CSRF checks.

    Raises:
        Forbidden: posted from another origin, or without this session's CSRF token.
        BadRequest: not a form, or larger than :data:`MAX_FORM_BYTES`.
    """
    state = hub_state(request)
    check_same_origin(request, state.config)
    form = await read_form(request, MAX_FORM_BYTES)
    given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD, "")
    if not given or not _csrf_matches(user, given):
        raise Forbidden("403 Forbidden - the CSRF token is missing or is not this session's: reload the page")
    return form


def _csrf_matches(user: ConsoleUser, given: str) -> bool:
    return hmac.compare_digest(user.csrf_token.encode(), given.encode())


def plain_words(exc: HubError) -> str:
    """A hub error as a sentence for people: no status codes, each field named."""
    if isinstance(exc.message, dict):
        return "; ".join(f"{field.replace('_', ' ')} {p}" for field, problems in exc.message.items() for p in problems)
    text = exc.message
    if isinstance(exc, NotFound):
        what = text.removeprefix("404 ").removesuffix(" Not Found").removesuffix(" Not found").strip() or "page"
        return f"{what} not found, or you do not have access to it."
    for prefix in ("403 Forbidden - ", "400 Bad request - ", "401 Unauthorized - "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
    if isinstance(exc, Forbidden):
        return "You are not allowed to do that."
    if isinstance(exc, BadRequest):
        return text
    return text


def render(
    request: Request, template: str, user: ConsoleUser | None, status_code: int = 200, **context: Any
) -> HTMLResponse:
    """Render ``template`` with the user, the CSRF token and ``context``; adds :data:`PAGE_HEADERS`."""
    state: HubState = hub_state(request)
    response: HTMLResponse = templates.TemplateResponse(
        request,
        template,
        {"user": user, "csrf_token": user.csrf_token if user else "", "config": state.config, **context},
        status_code=status_code,
        headers=PAGE_HEADERS,
    )
    return response


def see_other(url: str) -> RedirectResponse:
    """303 to ``url`` (after a successful form post); htmx follows it too."""
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})
