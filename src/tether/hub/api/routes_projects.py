"""``/projects`` (GitLab "Projects API"): create, list, get, delete."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sqlalchemy import select

from tether.hub.api.auth import Reader, Writer
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import fetch_page, set_headers
from tether.hub.api.schemas_in import ProjectCreate
from tether.hub.api.schemas_out import ProjectOut, project_out
from tether.hub.db.namespaces import Namespace
from tether.hub.roles import Role
from tether.hub.service import projects
from tether.hub.service.access import require_project_level
from tether.hub.service.paths import find_project

router = APIRouter(tags=["projects"])


@router.get("/projects", summary="List projects")
async def list_projects(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, search: str | None = None
) -> list[ProjectOut]:
    """Projects you are a member of (directly or through a group); administrators see all."""
    async with state.db.transaction() as session:
        items, total = await fetch_page(session, projects.visible_projects_query(principal, search), paging)
        ids = {p.namespace_id for p in items}
        namespaces = {n.id: n for n in await session.scalars(select(Namespace).where(Namespace.id.in_(ids)))}
    set_headers(request, response, paging, total)
    return [project_out(p, namespaces[p.namespace_id], state.config.base_url) for p in items]


@router.post("/projects", status_code=201, summary="Create a project")
async def create_project(state: State, principal: Writer, body: ProjectCreate) -> ProjectOut:
    """In your personal namespace, or in ``namespace_id`` (a group where you are Maintainer or above)."""
    async with state.db.transaction() as session:
        project = await projects.create_project(
            session,
            principal,
            body.name,
            body.path,
            body.namespace_id,
            body.description,
            body.default_branch,
        )
        namespace = await session.get_one(Namespace, project.namespace_id)
        return project_out(project, namespace, state.config.base_url)


@router.get("/projects/{project_id}", summary="Get a project")
async def get_project(state: State, principal: Reader, project_id: str) -> ProjectOut:
    """One project by id or URL-encoded full path (``group%2Fproject``)."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        await require_project_level(session, principal, project, Role.GUEST)
        namespace = await session.get_one(Namespace, project.namespace_id)
        return project_out(project, namespace, state.config.base_url)


@router.delete("/projects/{project_id}", status_code=202, summary="Delete a project")
async def delete_project(state: State, principal: Writer, project_id: str) -> JSONResponse:
    """Owner only; removes the project's agents and their tokens."""
    async with state.db.transaction() as session:
        await projects.delete_project(session, principal, await find_project(session, ref(project_id)))
    return JSONResponse({"message": "202 Accepted"}, status_code=202)
