"""``/groups`` (GitLab "Groups API"): create, list, get, delete, subgroups and projects of a group."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from tether.hub.api.auth import Reader, Writer
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import fetch_page, set_headers
from tether.hub.api.schemas_in import GroupCreate
from tether.hub.api.schemas_out import GroupOut, ProjectOut, group_out, project_out
from tether.hub.roles import Role
from tether.hub.service import groups, projects
from tether.hub.service.access import require_group_level
from tether.hub.service.paths import find_group

router = APIRouter(tags=["groups"])


@router.get("/groups", summary="List groups")
async def list_groups(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, search: str | None = None
) -> list[GroupOut]:
    """Groups you are a member of (directly or through a parent group); administrators see all."""
    async with state.db.transaction() as session:
        items, total = await fetch_page(session, groups.visible_groups_query(principal, search), paging)
    set_headers(request, response, paging, total)
    return [group_out(g, state.config.base_url) for g in items]


@router.post("/groups", status_code=201, summary="Create a group")
async def create_group(state: State, principal: Writer, body: GroupCreate) -> GroupOut:
    """Top-level groups: any user; subgroups: Maintainer of the parent. You become the group's Owner."""
    async with state.db.transaction() as session:
        group = await groups.create_group(session, principal, body.name, body.path, body.parent_id, body.description)
        return group_out(group, state.config.base_url)


@router.get("/groups/{group_id}", summary="Get a group")
async def get_group(state: State, principal: Reader, group_id: str) -> GroupOut:
    """One group by id or URL-encoded full path."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        await require_group_level(session, principal, group, Role.GUEST)
        return group_out(group, state.config.base_url)


@router.delete("/groups/{group_id}", status_code=202, summary="Delete a group")
async def delete_group(state: State, principal: Writer, group_id: str) -> JSONResponse:
    """Owner only; removes subgroups, projects, agents and their tokens."""
    async with state.db.transaction() as session:
        await groups.delete_group(session, principal, await find_group(session, ref(group_id)))
    return JSONResponse({"message": "202 Accepted"}, status_code=202)


@router.get("/groups/{group_id}/subgroups", summary="List a group's subgroups")
async def list_subgroups(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, group_id: str
) -> list[GroupOut]:
    """Direct subgroups."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        await require_group_level(session, principal, group, Role.GUEST)
        items, total = await fetch_page(session, groups.subgroups_query(group), paging)
    set_headers(request, response, paging, total)
    return [group_out(g, state.config.base_url) for g in items]


@router.get("/groups/{group_id}/projects", summary="List a group's projects")
async def list_group_projects(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, group_id: str
) -> list[ProjectOut]:
    """Projects directly in the group."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        await require_group_level(session, principal, group, Role.GUEST)
        items, total = await fetch_page(session, projects.namespace_projects_query(group), paging)
    set_headers(request, response, paging, total)
    return [project_out(p, group, state.config.base_url) for p in items]
