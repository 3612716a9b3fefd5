"""A project's agents, an agent's page (live connections, tokens, configuration, kubectl) and its graph page.

Rights are the REST API's (docs/hub.md): Developer or above sees agents, their tokens, configuration and
connections; Maintainer or above registers agents, creates and revokes tokens and writes the configuration.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.api.connections import agent_connections
from tether.hub.api.state import hub_state
from tether.hub.console.web import ConsoleUser, checked_form, console_user, plain_words, render, see_other
from tether.hub.console.yaml_lines import error_line
from tether.hub.db.agents import ClusterAgent
from tether.hub.db.namespaces import Project
from tether.hub.errors import BadRequest, Forbidden, HubError
from tether.hub.roles import Role
from tether.hub.service import access, agents
from tether.hub.service.paths import find_project

router = APIRouter(include_in_schema=False)
User_ = Annotated[ConsoleUser, Depends(console_user)]
LIST_LIMIT = 200


async def _project(session: AsyncSession, user: ConsoleUser, project_id: int) -> tuple[Project, int]:
    """The project and the user's role on it (0..50). Raises NotFound when the user has no role."""
    project = await find_project(session, project_id)
    level = await access.require_project_level(session, user.principal, project, Role.GUEST)
    return project, level


async def _project_page(
    request: Request, user: ConsoleUser, project_id: int, status: int = 200, **extra: Any
) -> HTMLResponse:
    state = hub_state(request)
    async with state.db.transaction() as session:
        project, level = await _project(session, user, project_id)
        rows: list[ClusterAgent] = []
        if level >= Role.DEVELOPER:
            rows = list((await session.scalars(agents.agents_query(project).limit(LIST_LIMIT))).all())
    return render(
        request,
        "project.html",
        user,
        status,
        project=project,
        agents=rows,
        can_read=level >= Role.DEVELOPER,
        can_manage=level >= Role.MAINTAINER,
        **extra,
    )


@router.get("/projects/{project_id}", response_class=HTMLResponse)
async def project_page(request: Request, user: User_, project_id: int) -> HTMLResponse:
    """A project's agents and (for maintainers) a form to register one."""
    return await _project_page(request, user, project_id)


@router.post("/projects/{project_id}/agents", response_class=HTMLResponse)
async def create_agent(request: Request, user: User_, project_id: int) -> Response:
    """Register an agent; then its page."""
    form = await checked_form(request, user)
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            project = await find_project(session, project_id)
            agent = await agents.create_agent(session, user.principal, project, form.get("name", "").strip())
    except HubError as exc:
        return await _project_page(request, user, project_id, exc.status, error=plain_words(exc), form=form)
    return see_other(f"/projects/{project_id}/agents/{agent.id}")


def kubeconfig_snippet(proxy_url: str, ca_pem: bytes | None, agent_id: int, username: str) -> str:
    """A kubeconfig for kas' Kubernetes API proxy with a ``pat:<agent id>:<token>`` placeholder (kas.md §4.5)."""
    lines = ["apiVersion: v1", "kind: Config", "clusters:", "- name: tether", "  cluster:", f"    server: {proxy_url}"]
    if ca_pem:
        lines.append(f"    certificate-authority-data: {base64.b64encode(ca_pem).decode()}")
    lines += [
        "users:",
        f"- name: {username}",
        "  user:",
        f"    token: pat:{agent_id}:<your personal access token with scope k8s_proxy>",
        "contexts:",
        f"- name: agent-{agent_id}",
        "  context:",
        "    cluster: tether",
        f"    user: {username}",
        f"current-context: agent-{agent_id}",
    ]
    return "\n".join(lines) + "\n"


async def _agent_page(
    request: Request, user: ConsoleUser, project_id: int, agent_id: int, status: int = 200, **extra: Any
) -> HTMLResponse:
    state = hub_state(request)
    async with state.db.transaction() as session:
        project, level = await _project(session, user, project_id)
        agent = await agents.get_agent(session, user.principal, project, agent_id)
        tokens = list((await session.scalars(agents.active_tokens_query(agent).limit(LIST_LIMIT))).all())
        configuration = await agents.get_configuration(session, agent)
    connections, connections_error = await agent_connections(state, agent.id)
    kas = state.config.kas
    snippet = None
    if kas.k8s_proxy_url:
        ca = kas.k8s_proxy_ca_certificate_file.read_bytes() if kas.k8s_proxy_ca_certificate_file else None
        snippet = kubeconfig_snippet(kas.k8s_proxy_url, ca, agent.id, user.username)
    content = configuration.row.content if configuration.row is not None else ""
    context: dict[str, Any] = {
        "project": project,
        "agent": agent,
        "tokens": tokens,
        "configuration": configuration,
        "config_text": content,
        "connections": connections,
        "connections_error": connections_error,
        "can_manage": level >= Role.MAINTAINER,
        "kubeconfig": snippet,
        "config_error": None,
        "config_error_line": None,
    }
    context.update(extra)
    return render(request, "agent.html", user, status, **context)


@router.get("/projects/{project_id}/agents/{agent_id}", response_class=HTMLResponse)
async def agent_page(request: Request, user: User_, project_id: int, agent_id: int) -> HTMLResponse:
    """The agent page."""
    return await _agent_page(request, user, project_id, agent_id)


@router.get("/projects/{project_id}/agents/{agent_id}/connections", response_class=HTMLResponse)
async def connections_fragment(request: Request, user: User_, project_id: int, agent_id: int) -> HTMLResponse:
    """The live connections table alone (htmx polls it)."""
    state = hub_state(request)
    async with state.db.transaction() as session:
        project, _level = await _project(session, user, project_id)
        agent = await agents.get_agent(session, user.principal, project, agent_id)
    connections, error = await agent_connections(state, agent.id)
    return render(request, "_connections.html", user, connections=connections, connections_error=error)


@router.post("/projects/{project_id}/agents/{agent_id}/tokens", response_class=HTMLResponse)
async def create_agent_token(request: Request, user: User_, project_id: int, agent_id: int) -> Response:
    """Create an agent token; the page shows it this once."""
    form = await checked_form(request, user)
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            project = await find_project(session, project_id)
            agent = await agents.get_agent(session, user.principal, project, agent_id, Role.MAINTAINER)
            row, plain = await agents.create_token(
                session, user.principal, agent, form.get("name", ""), form.get("description", "")
            )
    except HubError as exc:
        return await _agent_page(request, user, project_id, agent_id, exc.status, token_error=plain_words(exc))
    return await _agent_page(request, user, project_id, agent_id, 201, created_token=plain, created_row=row)


@router.post("/projects/{project_id}/agents/{agent_id}/tokens/{token_id}/revoke", response_class=HTMLResponse)
async def revoke_agent_token(request: Request, user: User_, project_id: int, agent_id: int, token_id: int) -> Response:
    """Revoke an agent token: kas refuses it from its next authentication on."""
    await checked_form(request, user)
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            project = await find_project(session, project_id)
            agent = await agents.get_agent(session, user.principal, project, agent_id, Role.MAINTAINER)
            agents.revoke_token(await agents.get_token(session, agent, token_id))
    except HubError as exc:
        return await _agent_page(request, user, project_id, agent_id, exc.status, token_error=plain_words(exc))
    return see_other(f"/projects/{project_id}/agents/{agent_id}#tokens")


@router.post("/projects/{project_id}/agents/{agent_id}/configuration", response_class=HTMLResponse)
async def save_configuration(request: Request, user: User_, project_id: int, agent_id: int) -> Response:
    """Store the configuration YAML; a mistake shows the form again, the text kept, the error by its line."""
    form = await checked_form(request, user)
    content = form.get("content", "").replace("\r\n", "\n")
    state = hub_state(request)
    try:
        async with state.db.transaction() as session:
            project = await find_project(session, project_id)
            agent = await agents.get_agent(session, user.principal, project, agent_id, Role.MAINTAINER)
            await agents.set_configuration(session, user.principal, agent, content)
    except BadRequest as exc:
        field = next(iter(exc.message)) if isinstance(exc.message, dict) else "configuration"
        return await _agent_page(
            request,
            user,
            project_id,
            agent_id,
            400,
            config_text=content,
            config_error=plain_words(exc),
            config_error_line=error_line(content, field),
        )
    except Forbidden as exc:
        return await _agent_page(request, user, project_id, agent_id, 403, config_error=plain_words(exc))
    return see_other(f"/projects/{project_id}/agents/{agent_id}?saved=1#configuration")


@router.get("/projects/{project_id}/agents/{agent_id}/graph", response_class=HTMLResponse)
async def graph_page(request: Request, user: User_, project_id: int, agent_id: int) -> HTMLResponse:
    """The live cluster graph, drawn in the browser from the Graph API through kas."""
    state = hub_state(request)
    async with state.db.transaction() as session:
        project, _level = await _project(session, user, project_id)
        agent = await agents.get_agent(session, user.principal, project, agent_id)
    return render(
        request,
        "graph.html",
        user,
        project=project,
        agent=agent,
        graph_available=state.config.kas.k8s_proxy_url is not None,
    )
