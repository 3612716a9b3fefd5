"""Groups: create, list, delete (GitLab ``/groups``).

Rules (GitLab defaults): any user may create a top-level group; creating a subgroup needs Maintainer on the
parent; the creator becomes the group's Owner; deleting needs Owner.
"""

from __future__ import annotations

import logging

from sqlalchemy import Select, exists, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.namespaces import KIND_GROUP, GroupMember, Namespace
from tether.hub.db.types import utcnow
from tether.hub.errors import BadRequest, Conflict
from tether.hub.roles import Role
from tether.hub.service.access import require_group_level
from tether.hub.service.paths import find_group, is_under, path_taken
from tether.hub.service.principal import Principal
from tether.hub.validation import check_name, check_path

log = logging.getLogger(__name__)


async def create_group(
    session: AsyncSession,
    principal: Principal,
    name: str,
    path: str,
    parent_ref: str | int | None = None,
    description: str = "",
) -> Namespace:
    """Create a group (a subgroup when ``parent_ref`` names a group).

    Raises:
        BadRequest: invalid name, path or description.
        NotFound: the parent group is not visible to the principal.
        Forbidden: the principal is below Maintainer on the parent.
        Conflict: the full path is taken by a namespace or project.
    """
    name = check_name(name)
    check_path(path)
    if len(description) > 2048:
        raise BadRequest.field("description", "is too long (maximum is 2048 characters)")
    parent = None
    if parent_ref is not None:
        parent = await find_group(session, parent_ref)
        await require_group_level(session, principal, parent, Role.MAINTAINER)
    full_path = f"{parent.full_path}/{path}" if parent else path
    if await path_taken(session, full_path):
        raise Conflict({"path": ["has already been taken"]})
    group = Namespace(
        kind=KIND_GROUP,
        name=name,
        path=path,
        full_path=full_path,
        full_name=f"{parent.full_name} / {name}" if parent else name,
        description=description,
        parent_id=parent.id if parent else None,
        created_at=utcnow(),
    )
    session.add(group)
    await session.flush()
    if principal.user_id is not None:
        session.add(
            GroupMember(namespace_id=group.id, user_id=principal.user_id, access_level=Role.OWNER, created_at=utcnow())
        )
        await session.flush()
    log.info("group %d %s created", group.id, full_path)
    return group


def visible_groups_query(principal: Principal, search: str | None = None) -> Select[Namespace]:
    """Groups the principal is a member of, directly or through an ancestor (administrators: all), by id."""
    query = select(Namespace).where(Namespace.kind == KIND_GROUP).order_by(Namespace.id)
    if not principal.admin and principal.user_id is not None:
        ancestor = Namespace.__table__.alias("ancestor")
        member_of_ancestor = exists().where(
            GroupMember.user_id == principal.user_id,
            GroupMember.namespace_id == ancestor.c.id,
            (Namespace.full_path == ancestor.c.full_path) | is_under(Namespace.full_path, ancestor.c.full_path),
        )
        query = query.where(member_of_ancestor)
    if search:
        text = search.lower()
        query = query.where(
            func.lower(Namespace.full_path).contains(text, autoescape=True)
            | func.lower(Namespace.name).contains(text, autoescape=True)
        )
    return query


def subgroups_query(group: Namespace) -> Select[Namespace]:
    """Direct subgroups of ``group``, by id."""
    return select(Namespace).where(Namespace.parent_id == group.id).order_by(Namespace.id)


async def delete_group(session: AsyncSession, principal: Principal, group: Namespace) -> None:
    """Delete ``group`` with its subgroups, projects and their agents (database cascade).

    Raises:
        Forbidden: the principal is below Owner.
    """
    await require_group_level(session, principal, group, Role.OWNER)
    await session.delete(group)
    await session.flush()
    log.info("group %d %s deleted", group.id, group.full_path)
