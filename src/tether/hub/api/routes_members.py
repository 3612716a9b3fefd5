"""``/projects/:id/members`` and ``/groups/:id/members`` (GitLab "Group and project members API").

Both sources get the same six routes; only how the source is found and which service calls apply differ.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

from fastapi import APIRouter, Request, Response

from tether.hub.api.auth import Reader, Writer
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import set_headers, slice_page
from tether.hub.api.schemas_in import MemberCreate, MemberUpdate
from tether.hub.api.schemas_out import MemberOut, member_out
from tether.hub.errors import NotFound
from tether.hub.ids import RowId
from tether.hub.service import members
from tether.hub.service.paths import find_group, find_project

router = APIRouter(tags=["members"])


def _expiry(day: date | None) -> datetime | None:
    # GitLab: a membership expiring on a date ends at the start of that day (UTC).
    return datetime.combine(day, time(), tzinfo=UTC) if day else None


@dataclass(frozen=True)
class _Source:
    """Where memberships hang: the URL collection, the finder and the service calls for it."""

    noun: str
    collection: str
    find: Callable[..., Awaitable[Any]]
    list_members: Callable[..., Awaitable[list[members.Member]]]
    add: Callable[..., Awaitable[members.Member]]
    update: Callable[..., Awaitable[members.Member]]
    remove: Callable[..., Awaitable[None]]


_SOURCES = (
    _Source(
        "project",
        "projects",
        find_project,
        members.project_members,
        members.add_project_member,
        members.update_project_member,
        members.remove_project_member,
    ),
    _Source(
        "group",
        "groups",
        find_group,
        members.group_members,
        members.add_group_member,
        members.update_group_member,
        members.remove_group_member,
    ),
)


def _register(source: _Source) -> None:
    base = f"/{source.collection}/{{source_id}}/members"

    async def list_direct(
        request: Request, response: Response, state: State, principal: Reader, paging: Paging, source_id: str
    ) -> list[MemberOut]:
        """Direct members only; ``/members/all`` adds inherited ones."""
        async with state.db.transaction() as session:
            found = await source.list_members(session, principal, await source.find(session, ref(source_id)))
        items, total = slice_page(found, paging)
        set_headers(request, response, paging, total)
        return [member_out(m, state.config.base_url) for m in items]

    async def list_all(
        request: Request, response: Response, state: State, principal: Reader, paging: Paging, source_id: str
    ) -> list[MemberOut]:
        """Each user once, with their highest role."""
        async with state.db.transaction() as session:
            found_source = await source.find(session, ref(source_id))
            found = await source.list_members(session, principal, found_source, inherited=True)
        items, total = slice_page(found, paging)
        set_headers(request, response, paging, total)
        return [member_out(m, state.config.base_url) for m in items]

    async def get_one(state: State, principal: Reader, source_id: str, user_id: RowId) -> MemberOut:
        """One direct member."""
        async with state.db.transaction() as session:
            found = await source.list_members(session, principal, await source.find(session, ref(source_id)))
        for member in found:
            if member.user.id == user_id:
                return member_out(member, state.config.base_url)
        raise NotFound("Member")

    async def add(state: State, principal: Writer, source_id: str, body: MemberCreate) -> MemberOut:
        """Maintainer or above; you cannot grant a role above your own."""
        async with state.db.transaction() as session:
            found_source = await source.find(session, ref(source_id))
            member = await source.add(
                session, principal, found_source, body.user_id, body.access_level, _expiry(body.expires_at)
            )
            return member_out(member, state.config.base_url)

    async def update(state: State, principal: Writer, source_id: str, user_id: RowId, body: MemberUpdate) -> MemberOut:
        """Maintainer or above."""
        async with state.db.transaction() as session:
            found_source = await source.find(session, ref(source_id))
            member = await source.update(
                session, principal, found_source, user_id, body.access_level, _expiry(body.expires_at)
            )
            return member_out(member, state.config.base_url)

    async def remove(state: State, principal: Writer, source_id: str, user_id: RowId) -> Response:
        """Maintainer or above (anyone may remove themselves)."""
        async with state.db.transaction() as session:
            await source.remove(session, principal, await source.find(session, ref(source_id)), user_id)
        return Response(status_code=204)

    noun = source.noun
    routes: list[tuple[str, Callable[..., Any], str, str, int]] = [
        ("", list_direct, "GET", f"List a {noun}'s direct members", 200),
        ("/all", list_all, "GET", f"List a {noun}'s members, including inherited ones", 200),
        ("/{user_id}", get_one, "GET", f"Get a {noun}'s direct member", 200),
        ("", add, "POST", f"Add a {noun} member", 201),
        ("/{user_id}", update, "PUT", f"Change a {noun} member's role", 200),
        ("/{user_id}", remove, "DELETE", f"Remove a {noun} member", 204),
    ]
    for suffix, endpoint, method, summary, status in routes:
        name = f"{endpoint.__name__}_{noun}_member"
        router.add_api_route(
            base + suffix, endpoint, methods=[method], summary=summary, status_code=status, name=name, operation_id=name
        )


for _source in _SOURCES:
    _register(_source)
