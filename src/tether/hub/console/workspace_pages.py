"""The workspaces page: the user's workspaces with their state, live; create one from a devfile; change its state.

The page calls the hub's workspace operations directly (:mod:`tether.hub.workspaces.operations`, the same rules as
GraphQL's ``workspaceCreate`` and ``workspaceUpdate``) from form handlers, with the browser session and its CSRF
token like every console form. A user sees and changes only their own workspaces (administrators: all); someone
else's is "not found". The list refreshes itself: htmx asks ``/workspaces/live`` every 2 s with a digest of what it
shows, and the hub answers 204 (nothing to swap) until a state changes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.api.connections import announce_workspace_changes
from tether.hub.api.state import hub_state
from tether.hub.console.web import ConsoleUser, checked_form, console_user, plain_words, render, see_other
from tether.hub.db.agents import AgentConfiguration, ClusterAgent
from tether.hub.db.namespaces import Project
from tether.hub.db.workspaces import Workspace
from tether.hub.errors import BadRequest, HubError
from tether.hub.ids import RowId
from tether.hub.service import projects
from tether.hub.workspaces import listing, operations
from tether.hub.workspaces.address import address
from tether.modules.remote_development.hub.settings import from_configuration
from tether.modules.remote_development.states import State
from tether.tool.ids import parse_id

router = APIRouter(include_in_schema=False)
User_ = Annotated[ConsoleUser, Depends(console_user)]
#: The page lists at most this many workspaces, projects or agents.
LIST_LIMIT = 200
#: Seconds between two refreshes of the list in the browser.
POLL_SECONDS = 2
#: The badge of each actual state: running, at rest, failing; every other state is on its way somewhere.
BADGES: dict[str, str] = {
    State.RUNNING: "ok",
    State.STOPPED: "off",
    State.TERMINATED: "off",
    State.FAILED: "bad",
    State.ERROR: "bad",
    State.UNKNOWN: "bad",
}
#: What each button asks for, by the desired state it is offered in (a terminated workspace is final).
ACTIONS: dict[str, list[tuple[str, str]]] = {
    State.RUNNING: [("Stop", State.STOPPED), ("Restart", State.RESTART_REQUESTED), ("Terminate", State.TERMINATED)],
    State.RESTART_REQUESTED: [("Stop", State.STOPPED), ("Terminate", State.TERMINATED)],
    State.STOPPED: [("Start", State.RUNNING), ("Terminate", State.TERMINATED)],
}
#: The service layer names fields as GraphQL does; the form's labels are these.
FIELD_LABELS = {"clusterAgentId": "agent", "projectId": "project", "desiredState": "desired state"}


@dataclass(frozen=True)
class Item:
    """One row of the list.

    Attributes:
        row: the workspace.
        near: its agent, owner, project and DNS zone.
        url: its address through kas, or None while it is not running.
        badge: CSS class of its actual state's badge.
        actions: (button label, desired state) pairs offered now.
    """

    row: Workspace
    near: listing.Related
    url: str | None
    badge: str
    actions: list[tuple[str, str]]


@dataclass(frozen=True)
class AgentChoice:
    """An agent with workspaces enabled, in a project the user sees."""

    id: int
    name: str
    project_path: str


def _plain(exc: HubError) -> str:
    if isinstance(exc, BadRequest) and isinstance(exc.message, dict):
        renamed = {FIELD_LABELS.get(field, field): problems for field, problems in exc.message.items()}
        return plain_words(BadRequest(renamed))
    return plain_words(exc)


async def _items(request: Request, session: AsyncSession, user: ConsoleUser) -> list[Item]:
    rows = list(await session.scalars(operations.visible_query(user.principal).limit(LIST_LIMIT)))
    near = await listing.related(session, [row.id for row in rows])
    base = hub_state(request).config.kas.workspaces_url
    items = []
    for row in rows:
        about = near[row.id]
        running = row.actual_state == State.RUNNING and row.desired_state == State.RUNNING
        reachable = running and (base is not None or about.dns_zone)
        url = address(row.url_prefix, row.name, about.dns_zone, about.project_path, base) if reachable else None
        items.append(Item(row, about, url, BADGES.get(row.actual_state, "busy"), ACTIONS.get(row.desired_state, [])))
    return items


def digest(items: list[Item]) -> str:
    """A short hash of what the list shows: the browser sends it back, and the hub answers 204 while it holds."""
    shown = [[i.row.id, i.row.desired_state, i.row.actual_state, i.row.actual_state_message, i.url] for i in items]
    return hashlib.sha256(json.dumps(shown).encode()).hexdigest()[:16]


async def _choices(session: AsyncSession, user: ConsoleUser) -> tuple[list[Project], list[AgentChoice]]:
    visible = list(await session.scalars(projects.visible_projects_query(user.principal).limit(LIST_LIMIT)))
    paths = {project.id: project.full_path for project in visible}
    found = await session.execute(
        select(ClusterAgent, AgentConfiguration.document)
        .join(AgentConfiguration, AgentConfiguration.agent_id == ClusterAgent.id)
        .where(ClusterAgent.project_id.in_(list(paths)))
        .order_by(ClusterAgent.id)
        .limit(LIST_LIMIT)
    )
    agents = []
    for agent, document in found:
        try:
            enabled = from_configuration((document or {}).get("remote_development")).enabled
        except ValueError:
            enabled = False
        if enabled:
            agents.append(AgentChoice(agent.id, agent.name, paths[agent.project_id]))
    return visible, agents


async def _page(request: Request, user: ConsoleUser, status: int = 200, **extra: Any) -> HTMLResponse:
    async with hub_state(request).db.transaction() as session:
        items = await _items(request, session, user)
        visible, agents = await _choices(session, user)
    context: dict[str, Any] = {"form": {}, "error": None, "action_error": None}
    context.update(extra)
    return render(
        request,
        "workspaces.html",
        user,
        status,
        items=items,
        digest=digest(items),
        poll_seconds=POLL_SECONDS,
        projects=visible,
        agents=agents,
        default_devfile=hub_state(request).config.workspaces.default_devfile,
        **context,
    )


@router.get("/workspaces", response_class=HTMLResponse)
async def workspaces_page(request: Request, user: User_) -> HTMLResponse:
    """The user's workspaces and the form to create one."""
    return await _page(request, user)


@router.get("/workspaces/live", response_class=HTMLResponse)
async def workspaces_live(request: Request, user: User_) -> Response:
    """The list alone (htmx polls it); 204 when it still matches the digest ``v`` the browser holds."""
    async with hub_state(request).db.transaction() as session:
        items = await _items(request, session, user)
    now = digest(items)
    if request.query_params.get("v") == now:
        return Response(status_code=204, headers={"Cache-Control": "no-store"})
    return render(request, "_workspaces.html", user, items=items, digest=now, poll_seconds=POLL_SECONDS)


@router.post("/workspaces", response_class=HTMLResponse)
async def create_workspace(request: Request, user: User_) -> Response:
    """Create a workspace from the devfile in the form; the page shows it at once (CreationRequested)."""
    form = await checked_form(request, user)
    try:
        wanted = operations.CreateRequest(
            cluster_agent_id=_number(form.get("agent", ""), "clusterAgentId"),
            project_id=_number(form.get("project", ""), "projectId"),
            desired_state=form.get("desired_state", State.RUNNING),
            project_ref=form.get("project_ref", "").strip() or "main",
            devfile_path=form.get("devfile_path", "").strip() or None,
            devfile=form.get("devfile", "").replace("\r\n", "\n") or None,
            name=form.get("name", "").strip() or None,
        )
        state = hub_state(request)
        async with state.db.transaction() as session:
            row = await operations.create(
                session,
                user.principal,
                wanted,
                user_limit=state.config.workspaces.max_active_workspaces_per_user,
                default_devfile=state.config.workspaces.default_devfile,
            )
    except HubError as exc:
        return await _page(request, user, exc.status, error=_plain(exc), form=form)
    await announce_workspace_changes(hub_state(request), [row.name])  # a refusal kas cached for the name goes
    return see_other(f"/workspaces#workspace-{row.id}")


def _number(text: str, field: str) -> int:
    found = parse_id(text.strip())
    if found is None:
        raise BadRequest.field(field, "is missing: choose one" if not text.strip() else "is not an id")
    return found


@router.post("/workspaces/{workspace_id}/state", response_class=HTMLResponse)
async def change_state(request: Request, user: User_, workspace_id: RowId) -> Response:
    """Ask for another desired state (Running, Stopped, RestartRequested or Terminated) of one of your workspaces."""
    form = await checked_form(request, user)
    try:
        async with hub_state(request).db.transaction() as session:
            row = await operations.update(session, user.principal, workspace_id, form.get("desired_state", ""))
    except BadRequest as exc:
        return await _page(request, user, exc.status, action_error=_plain(exc))
    await announce_workspace_changes(hub_state(request), [row.name])
    return see_other(f"/workspaces#workspace-{workspace_id}")
