"""``/projects/:id/members`` and ``/groups/:id/members`` (GitLab "Group and project members API")."""

from __future__ import annotations

from datetime import UTC, date, datetime, time

from fastapi import APIRouter, Request, Response

from tether.hub.api.auth import Reader, Writer
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import set_headers, slice_page
from tether.hub.api.schemas_in import MemberCreate, MemberUpdate
from tether.hub.api.schemas_out import MemberOut, member_out
from tether.hub.errors import NotFound
from tether.hub.service import members
from tether.hub.service.paths import find_group, find_project

router = APIRouter(tags=["members"])


def _expiry(day: date | None) -> datetime | None:
    # GitLab: a membership expiring on a date ends at the start of that day (UTC).
    return datetime.combine(day, time(), tzinfo=UTC) if day else None


@router.get("/projects/{project_id}/members", summary="List a project's direct members")
async def list_project_members(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, project_id: str
) -> list[MemberOut]:
    """Direct members only; ``/members/all`` adds members through groups."""
    async with state.db.transaction() as session:
        found = await members.project_members(session, principal, await find_project(session, ref(project_id)))
    items, total = slice_page(found, paging)
    set_headers(request, response, paging, total)
    return [member_out(m, state.config.base_url) for m in items]


@router.get("/projects/{project_id}/members/all", summary="List a project's members, including inherited ones")
async def list_all_project_members(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, project_id: str
) -> list[MemberOut]:
    """Each user once, with their highest role."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        found = await members.project_members(session, principal, project, inherited=True)
    items, total = slice_page(found, paging)
    set_headers(request, response, paging, total)
    return [member_out(m, state.config.base_url) for m in items]


@router.get("/projects/{project_id}/members/{user_id}", summary="Get a project's direct member")
async def get_project_member(state: State, principal: Reader, project_id: str, user_id: int) -> MemberOut:
    """One direct member."""
    async with state.db.transaction() as session:
        found = await members.project_members(session, principal, await find_project(session, ref(project_id)))
    for member in found:
        if member.user.id == user_id:
            return member_out(member, state.config.base_url)
    raise NotFound("Member")


@router.post("/projects/{project_id}/members", status_code=201, summary="Add a project member")
async def add_project_member(state: State, principal: Writer, project_id: str, body: MemberCreate) -> MemberOut:
    """Maintainer or above; you cannot grant a role above your own."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        member = await members.add_project_member(
            session, principal, project, body.user_id, body.access_level, _expiry(body.expires_at)
        )
        return member_out(member, state.config.base_url)


@router.put("/projects/{project_id}/members/{user_id}", summary="Change a project member's role")
async def update_project_member(
    state: State, principal: Writer, project_id: str, user_id: int, body: MemberUpdate
) -> MemberOut:
    """Maintainer or above."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        member = await members.update_project_member(
            session, principal, project, user_id, body.access_level, _expiry(body.expires_at)
        )
        return member_out(member, state.config.base_url)


@router.delete("/projects/{project_id}/members/{user_id}", status_code=204, summary="Remove a project member")
async def remove_project_member(state: State, principal: Writer, project_id: str, user_id: int) -> Response:
    """Maintainer or above (anyone may remove themselves)."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        await members.remove_project_member(session, principal, project, user_id)
    return Response(status_code=204)


@router.get("/groups/{group_id}/members", summary="List a group's direct members")
async def list_group_members(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, group_id: str
) -> list[MemberOut]:
    """Direct members only; ``/members/all`` adds members of parent groups."""
    async with state.db.transaction() as session:
        found = await members.group_members(session, principal, await find_group(session, ref(group_id)))
    items, total = slice_page(found, paging)
    set_headers(request, response, paging, total)
    return [member_out(m, state.config.base_url) for m in items]


@router.get("/groups/{group_id}/members/all", summary="List a group's members, including inherited ones")
async def list_all_group_members(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, group_id: str
) -> list[MemberOut]:
    """Each user once, with their highest role."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        found = await members.group_members(session, principal, group, inherited=True)
    items, total = slice_page(found, paging)
    set_headers(request, response, paging, total)
    return [member_out(m, state.config.base_url) for m in items]


@router.get("/groups/{group_id}/members/{user_id}", summary="Get a group's direct member")
async def get_group_member(state: State, principal: Reader, group_id: str, user_id: int) -> MemberOut:
    """One direct member."""
    async with state.db.transaction() as session:
        found = await members.group_members(session, principal, await find_group(session, ref(group_id)))
    for member in found:
        if member.user.id == user_id:
            return member_out(member, state.config.base_url)
    raise NotFound("Member")


@router.post("/groups/{group_id}/members", status_code=201, summary="Add a group member")
async def add_group_member(state: State, principal: Writer, group_id: str, body: MemberCreate) -> MemberOut:
    """Maintainer or above; you cannot grant a role above your own."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        member = await members.add_group_member(
            session, principal, group, body.user_id, body.access_level, _expiry(body.expires_at)
        )
        return member_out(member, state.config.base_url)


@router.put("/groups/{group_id}/members/{user_id}", summary="Change a group member's role")
async def update_group_member(
    state: State, principal: Writer, group_id: str, user_id: int, body: MemberUpdate
) -> MemberOut:
    """Maintainer or above; a top-level group keeps at least one Owner."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        member = await members.update_group_member(
            session, principal, group, user_id, body.access_level, _expiry(body.expires_at)
        )
        return member_out(member, state.config.base_url)


@router.delete("/groups/{group_id}/members/{user_id}", status_code=204, summary="Remove a group member")
async def remove_group_member(state: State, principal: Writer, group_id: str, user_id: int) -> Response:
    """Maintainer or above (anyone may remove themselves); a top-level group keeps at least one Owner."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        await members.remove_group_member(session, principal, group, user_id)
    return Response(status_code=204)
