"""The console's pages: sign-in, projects, a project's agents, personal access tokens.

The agent page and the graph are in :mod:`tether.hub.console.agent_pages`, the workspaces page in
:mod:`tether.hub.console.workspace_pages`; static files are mounted by
:func:`install`. Pages redirect to the sign-in form without a live session; forms post back with the session's
CSRF token and redirect (303) on success, or show the page again with the error in plain words.
"""

from __future__ import annotations

import inspect
from datetime import date
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from tether.hub.api import routes_sessions
from tether.hub.api.browser import SESSION_COOKIE
from tether.hub.api.state import hub_state
from tether.hub.console import agent_pages, audit_pages, graph_relay, recording_pages, workspace_pages
from tether.hub.console.web import (
    STATIC_DIR,
    ConsoleUser,
    SignInRequired,
    checked_form,
    console_user,
    plain_words,
    render,
    see_other,
)
from tether.hub.db.users import PersonalAccessToken, User
from tether.hub.errors import BadRequest, HubError, NotFound
from tether.hub.service import projects, users
from tether.hub.service.principal import SCOPE_K8S_PROXY, SCOPES

router = APIRouter(include_in_schema=False)
User_ = Annotated[ConsoleUser, Depends(console_user)]
#: The console lists at most this many projects, agents or tokens on a page.
LIST_LIMIT = 200


@router.get("/", response_class=HTMLResponse)
async def home(request: Request) -> Response:
    """The sign-in form, or the projects page for a signed-in browser."""
    try:
        await console_user(request)
    except SignInRequired:
        return render(request, "sign_in.html", None, error=None, notice=request.query_params.get("notice"))
    return see_other("/projects")


@router.post("/sign_in", response_class=HTMLResponse)
async def sign_in(request: Request) -> Response:
    """Sign in through the hub's own ``/users/sign_in`` handler (same rules, cookies and refusals), then go on."""
    state = hub_state(request)
    answer = await routes_sessions.sign_in(request, state, request.cookies.get(SESSION_COOKIE))
    if answer.status_code != 200:
        error = "Invalid login or token." if answer.status_code == 401 else "Enter your username and a token."
        return render(request, "sign_in.html", None, answer.status_code, error=error, notice=None)
    redirect = see_other("/projects")
    for name, value in answer.raw_headers:
        if name == b"set-cookie":
            redirect.raw_headers.append((name, value))
    return redirect


@router.post("/sign_out", response_class=HTMLResponse)
async def sign_out(request: Request) -> Response:
    """End the session through the hub's ``/users/sign_out`` (which checks the CSRF token) and show the form."""
    state = hub_state(request)
    answer = await routes_sessions.sign_out(request, state, request.cookies.get(SESSION_COOKIE))
    redirect = see_other("/?notice=" + quote("You are signed out."))
    for name, value in answer.raw_headers:
        if name == b"set-cookie":
            redirect.raw_headers.append((name, value))
    return redirect


async def _projects_page(request: Request, user: ConsoleUser, status: int = 200, **extra: object) -> HTMLResponse:
    state = hub_state(request)
    async with state.db.transaction() as session:
        rows = (await session.scalars(projects.visible_projects_query(user.principal).limit(LIST_LIMIT))).all()
    return render(request, "projects.html", user, status, projects=rows, **extra)


@router.get("/projects", response_class=HTMLResponse)
async def projects_page(request: Request, user: User_) -> HTMLResponse:
    """The projects the user is a member of (administrators: all), and a form to create one."""
    return await _projects_page(request, user)


@router.post("/projects", response_class=HTMLResponse)
async def create_project(request: Request, user: User_) -> Response:
    """Create a project in the user's namespace or in the group named in ``namespace``."""
    form = await checked_form(request, user)
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            project = await projects.create_project(
                session,
                user.principal,
                form.get("name", "").strip() or None,
                form.get("path", "").strip() or None,
                form.get("namespace", "").strip() or None,
                form.get("description", "").strip(),
            )
    except HubError as exc:
        return await _projects_page(request, user, exc.status, error=plain_words(exc), form=form)
    return see_other(f"/projects/{project.id}")


async def _tokens_page(request: Request, user: ConsoleUser, status: int = 200, **extra: object) -> HTMLResponse:
    state = hub_state(request)
    async with state.db.transaction() as session:
        query = users.personal_access_tokens_query(user.principal).where(
            PersonalAccessToken.user_id == user.principal.user_id
        )
        rows = (await session.scalars(query.limit(LIST_LIMIT))).all()
    allowed = sorted(SCOPES) if user.principal.admin else [SCOPE_K8S_PROXY]
    return render(
        request,
        "tokens.html",
        user,
        status,
        tokens=rows,
        scopes=allowed,
        active=users.token_active,
        **extra,
    )


@router.get("/tokens", response_class=HTMLResponse)
async def tokens_page(request: Request, user: User_) -> HTMLResponse:
    """The user's personal access tokens, a form to create one and revoke buttons."""
    return await _tokens_page(request, user)


@router.post("/tokens", response_class=HTMLResponse)
async def create_token(request: Request, user: User_) -> Response:
    """Create a personal access token for yourself; the page shows it once.

    Scope ``k8s_proxy`` only (GitLab's self-service rule, as ``POST /user/personal_access_tokens``);
    administrators may choose any scope.
    """
    form = await checked_form(request, user)
    state = hub_state(request)
    allowed = SCOPES if user.principal.admin else frozenset({SCOPE_K8S_PROXY})
    wanted = [scope for scope in sorted(SCOPES) if form.get(f"scope_{scope}")]
    try:
        async with state.db.transaction() as session:
            owner = await session.get_one(User, user.principal.user_id)
            expires = form.get("expires_at", "").strip()
            try:
                expires_at = date.fromisoformat(expires) if expires else None
            except ValueError:
                raise BadRequest.field("expires_at", "is not a date (YYYY-MM-DD)") from None
            row, plain = await users.create_personal_access_token(
                session, owner, form.get("name", ""), wanted, expires_at, allowed_scopes=allowed
            )
    except HubError as exc:
        return await _tokens_page(request, user, exc.status, error=plain_words(exc), form=form)
    return await _tokens_page(request, user, 201, created=row, created_token=plain)


@router.post("/tokens/{token_id}/revoke", response_class=HTMLResponse)
async def revoke_token(request: Request, user: User_, token_id: int) -> Response:
    """Revoke one of your tokens."""
    await checked_form(request, user)
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            row = await users.get_personal_access_token(session, user.principal, token_id)
            if row.user_id != user.principal.user_id:
                raise NotFound("Personal Access Token")
            users.revoke_personal_access_token(row)
    except HubError as exc:
        return await _tokens_page(request, user, exc.status, error=plain_words(exc))
    return see_other("/tokens")


async def _sign_in_required(request: Request, _exc: Exception) -> Response:
    if request.headers.get("HX-Request"):
        return Response(status_code=401, headers={"HX-Redirect": "/"})
    return RedirectResponse("/", status_code=303)


def _is_console_path(path: str) -> bool:
    return not path.startswith(("/api/", "/users/", "/-/health", "/docs", "/openapi", "/redoc"))


def install(app: FastAPI) -> None:
    """Mount the console on ``app``: pages, the agent and workspace pages, the graph relay, ``/-/console/static``.

    Call after the API's error handlers are installed: a hub error on a console page is then shown as a page in
    plain words, and everywhere else still as the API's JSON body.
    """
    app.include_router(router)
    app.include_router(agent_pages.router)
    app.include_router(workspace_pages.router)
    app.include_router(audit_pages.router)
    app.include_router(graph_relay.router)
    app.include_router(recording_pages.router)
    app.mount("/-/console/static", StaticFiles(directory=STATIC_DIR), name="console-static")
    app.add_exception_handler(SignInRequired, _sign_in_required)
    api_handler = app.exception_handlers[HubError]

    async def hub_error(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, HubError) or not _is_console_path(request.url.path):
            answer = api_handler(request, exc)
            return await answer if inspect.isawaitable(answer) else answer
        try:
            user: ConsoleUser | None = await console_user(request)
        except SignInRequired:
            user = None
        return render(request, "error.html", user, exc.status, message=plain_words(exc))

    app.add_exception_handler(HubError, hub_error)


__all__ = ["LIST_LIMIT", "install", "router"]
