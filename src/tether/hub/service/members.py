"""Project and group memberships (GitLab ``/projects/:id/members``, ``/groups/:id/members``).

Rules (GitLab "Roles and permissions"): anyone who can see the project or group can list its members; adding,
changing and removing members needs Maintainer; nobody but an administrator can grant or change a role above
their own; a group keeps at least one Owner.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.namespaces import GroupMember, Namespace, Project, ProjectMember
from tether.hub.db.types import utcnow
from tether.hub.db.users import User
from tether.hub.errors import BadRequest, Conflict, Forbidden, NotFound
from tether.hub.roles import MEMBER_LEVELS, Role
from tether.hub.service.access import ancestor_paths, require_group_level, require_project_level
from tether.hub.service.principal import Principal
from tether.hub.service.users import get_user

log = logging.getLogger(__name__)
_Row = TypeVar("_Row", ProjectMember, GroupMember)


@dataclass(frozen=True)
class Member:
    """A user's role on a project or group as the API shows it.

    Attributes:
        user: the member.
        access_level: 10..50.
        created_at: when the membership was made.
        expires_at: when it stops counting, or None.
    """

    user: User
    access_level: int
    created_at: datetime
    expires_at: datetime | None


def check_access_level(level: int) -> Role:
    """Return the role of ``level``.

    Raises:
        BadRequest: on ``access_level`` when it is not 10, 20, 30, 40 or 50.
    """
    if level not in MEMBER_LEVELS:
        raise BadRequest.field("access_level", "does not have a valid value (use 10, 20, 30, 40 or 50)")
    return Role(level)


async def _members(session: AsyncSession, rows: list[tuple[int, int, datetime, datetime | None]]) -> list[Member]:
    best: dict[int, tuple[int, datetime, datetime | None]] = {}
    now = utcnow()
    for user_id, level, created_at, expires_at in rows:
        if expires_at is not None and expires_at <= now:
            continue
        if user_id not in best or level > best[user_id][0]:
            best[user_id] = (level, created_at, expires_at)
    if not best:
        return []
    users = {u.id: u for u in await session.scalars(select(User).where(User.id.in_(best)))}
    return [Member(users[uid], *best[uid]) for uid in sorted(best)]


async def project_members(
    session: AsyncSession, principal: Principal, project: Project, inherited: bool = False
) -> list[Member]:
    """Direct members of ``project`` by user id; with ``inherited``, also members through groups (highest role).

    Raises:
        NotFound: the project is not visible to the principal.
    """
    await require_project_level(session, principal, project, Role.GUEST)
    rows: list[tuple[int, int, datetime, datetime | None]] = [
        (m.user_id, m.access_level, m.created_at, m.expires_at)
        for m in await session.scalars(select(ProjectMember).where(ProjectMember.project_id == project.id))
    ]
    if inherited:
        namespace = await session.get_one(Namespace, project.namespace_id)
        if namespace.owner_id is not None:
            rows.append((namespace.owner_id, int(Role.OWNER), namespace.created_at, None))
        rows += await _ancestor_rows(session, namespace.full_path)
    return await _members(session, rows)


async def group_members(
    session: AsyncSession, principal: Principal, group: Namespace, inherited: bool = False
) -> list[Member]:
    """Direct members of ``group``; with ``inherited``, also members of its ancestors (highest role).

    Raises:
        NotFound: the group is not visible to the principal.
    """
    await require_group_level(session, principal, group, Role.GUEST)
    if inherited:
        rows = await _ancestor_rows(session, group.full_path)
    else:
        rows = [
            (m.user_id, m.access_level, m.created_at, m.expires_at)
            for m in await session.scalars(select(GroupMember).where(GroupMember.namespace_id == group.id))
        ]
    return await _members(session, rows)


async def _ancestor_rows(session: AsyncSession, full_path: str) -> list[tuple[int, int, datetime, datetime | None]]:
    result = await session.execute(
        select(GroupMember.user_id, GroupMember.access_level, GroupMember.created_at, GroupMember.expires_at)
        .join(Namespace, Namespace.id == GroupMember.namespace_id)
        .where(Namespace.full_path.in_(ancestor_paths(full_path)))
    )
    return [(int(a), int(b), c, d) for a, b, c, d in result.all()]


def _may_grant(own_level: int, principal: Principal, level: int) -> None:
    if not principal.admin and level > own_level:
        raise Forbidden(f"403 Forbidden - you cannot grant a role above your own ({Role(own_level).label})")


async def add_project_member(
    session: AsyncSession,
    principal: Principal,
    project: Project,
    user_ref: str | int,
    access_level: int,
    expires_at: datetime | None = None,
) -> Member:
    """Give a user a direct role on ``project``.

    Raises:
        BadRequest: invalid access level. NotFound: project or user. Forbidden: below Maintainer, or granting
        above one's own role. Conflict: already a direct member.
    """
    role = check_access_level(access_level)
    own = await require_project_level(session, principal, project, Role.MAINTAINER)
    _may_grant(own, principal, role)
    user = await get_user(session, user_ref)
    existing = await session.scalar(
        select(ProjectMember).where(ProjectMember.project_id == project.id, ProjectMember.user_id == user.id)
    )
    if existing is not None:
        raise Conflict("Member already exists")
    row = ProjectMember(
        project_id=project.id, user_id=user.id, access_level=role, created_at=utcnow(), expires_at=expires_at
    )
    session.add(row)
    await session.flush()
    log.info("user %d added to project %d as %s", user.id, project.id, role.label)
    return Member(user, row.access_level, row.created_at, row.expires_at)


async def add_group_member(
    session: AsyncSession,
    principal: Principal,
    group: Namespace,
    user_ref: str | int,
    access_level: int,
    expires_at: datetime | None = None,
) -> Member:
    """Give a user a direct role on ``group`` (inherited by its subgroups and projects).

    Raises:
        As :func:`add_project_member`.
    """
    role = check_access_level(access_level)
    own = await require_group_level(session, principal, group, Role.MAINTAINER)
    _may_grant(own, principal, role)
    user = await get_user(session, user_ref)
    existing = await session.scalar(
        select(GroupMember).where(GroupMember.namespace_id == group.id, GroupMember.user_id == user.id)
    )
    if existing is not None:
        raise Conflict("Member already exists")
    row = GroupMember(
        namespace_id=group.id, user_id=user.id, access_level=role, created_at=utcnow(), expires_at=expires_at
    )
    session.add(row)
    await session.flush()
    log.info("user %d added to group %d as %s", user.id, group.id, role.label)
    return Member(user, row.access_level, row.created_at, row.expires_at)


async def _direct(session: AsyncSession, model: type[_Row], source_column: str, source_id: int, user_id: int) -> _Row:
    row = await session.scalar(
        select(model).where(getattr(model, source_column) == source_id, model.user_id == user_id)
    )
    if row is None:
        raise NotFound("Member")
    return row


async def update_project_member(
    session: AsyncSession,
    principal: Principal,
    project: Project,
    user_id: int,
    access_level: int,
    expires_at: datetime | None = None,
) -> Member:
    """Change a direct member's role.

    Raises:
        BadRequest, NotFound, Forbidden: as :func:`add_project_member`, also when the member's current role is
        above the principal's.
    """
    role = check_access_level(access_level)
    own = await require_project_level(session, principal, project, Role.MAINTAINER)
    row = await _direct(session, ProjectMember, "project_id", project.id, user_id)
    _may_grant(own, principal, max(role, row.access_level))
    row.access_level = role
    row.expires_at = expires_at
    await session.flush()
    return Member(await session.get_one(User, user_id), row.access_level, row.created_at, row.expires_at)


async def update_group_member(
    session: AsyncSession,
    principal: Principal,
    group: Namespace,
    user_id: int,
    access_level: int,
    expires_at: datetime | None = None,
) -> Member:
    """Change a direct group member's role; the group keeps at least one Owner.

    Raises:
        As :func:`update_project_member`; BadRequest when the last Owner would be demoted.
    """
    role = check_access_level(access_level)
    own = await require_group_level(session, principal, group, Role.MAINTAINER)
    row = await _direct(session, GroupMember, "namespace_id", group.id, user_id)
    _may_grant(own, principal, max(role, row.access_level))
    if row.access_level == Role.OWNER and role != Role.OWNER:
        await _keep_an_owner(session, group, user_id)
    row.access_level = role
    row.expires_at = expires_at
    await session.flush()
    return Member(await session.get_one(User, user_id), row.access_level, row.created_at, row.expires_at)


async def remove_project_member(session: AsyncSession, principal: Principal, project: Project, user_id: int) -> None:
    """Remove a direct member (a user may always leave).

    Raises:
        NotFound, Forbidden: as :func:`update_project_member`.
    """
    row = await _direct(session, ProjectMember, "project_id", project.id, user_id)
    if user_id != principal.user_id:
        own = await require_project_level(session, principal, project, Role.MAINTAINER)
        _may_grant(own, principal, row.access_level)
    await session.delete(row)
    await session.flush()


async def remove_group_member(session: AsyncSession, principal: Principal, group: Namespace, user_id: int) -> None:
    """Remove a direct group member; the group keeps at least one Owner.

    Raises:
        NotFound, Forbidden, BadRequest: as :func:`update_group_member`.
    """
    row = await _direct(session, GroupMember, "namespace_id", group.id, user_id)
    if user_id != principal.user_id:
        own = await require_group_level(session, principal, group, Role.MAINTAINER)
        _may_grant(own, principal, row.access_level)
    if row.access_level == Role.OWNER:
        await _keep_an_owner(session, group, user_id)
    await session.delete(row)
    await session.flush()


async def _keep_an_owner(session: AsyncSession, group: Namespace, leaving_user_id: int) -> None:
    if group.parent_id is not None:  # a subgroup inherits its parent's owners
        return
    others = await session.scalar(
        select(func.count()).where(
            GroupMember.namespace_id == group.id,
            GroupMember.access_level == Role.OWNER,
            GroupMember.user_id != leaving_user_id,
        )
    )
    if not others:
        raise BadRequest.field("access_level", "a group must keep at least one owner")
