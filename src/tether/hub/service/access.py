"""Effective roles: a user's access level on a project or group, counting inherited group memberships.

GitLab rule ("Roles and permissions", "Inherited membership"): a member of a group is a member, with the same role,
of every subgroup and project under it; the highest of the direct and inherited roles applies. The owner of a
personal namespace is Owner of its projects. Administrators have every permission. Memberships past their
``expires_at`` no longer count.
"""

from __future__ import annotations

from sqlalchemy import func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.namespaces import GroupMember, Namespace, Project, ProjectMember
from tether.hub.db.types import utcnow
from tether.hub.errors import Forbidden, NotFound
from tether.hub.roles import Role
from tether.hub.service.principal import Principal


def ancestor_paths(full_path: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b", "a/b/c"]``: the full paths of a namespace and every ancestor."""
    parts = full_path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


async def inherited_group_level(session: AsyncSession, user_id: int, namespace_full_path: str) -> int:
    """The highest role ``user_id`` has through group memberships on ``namespace_full_path`` and its ancestors."""
    now = utcnow()
    level = await session.scalar(
        select(func.max(GroupMember.access_level))
        .join(Namespace, Namespace.id == GroupMember.namespace_id)
        .where(
            GroupMember.user_id == user_id,
            Namespace.full_path.in_(ancestor_paths(namespace_full_path)),
            or_(GroupMember.expires_at.is_(None), GroupMember.expires_at > now),
        )
    )
    return int(level or 0)


async def user_project_level(session: AsyncSession, user_id: int, project: Project) -> int:
    """The effective role of ``user_id`` on ``project`` by membership only (0: none). Admin status is ignored."""
    namespace = await session.get_one(Namespace, project.namespace_id)
    if namespace.owner_id == user_id:
        return int(Role.OWNER)
    now = utcnow()
    direct = await session.scalar(
        select(ProjectMember.access_level).where(
            ProjectMember.project_id == project.id,
            ProjectMember.user_id == user_id,
            or_(ProjectMember.expires_at.is_(None), ProjectMember.expires_at > now),
        )
    )
    inherited = await inherited_group_level(session, user_id, namespace.full_path)
    return max(int(direct or 0), inherited)


async def project_level(session: AsyncSession, principal: Principal, project: Project) -> int:
    """The effective role of ``principal`` on ``project``; administrators are Owner."""
    if principal.admin or principal.user_id is None:
        return int(Role.OWNER)
    return await user_project_level(session, principal.user_id, project)


async def group_level(session: AsyncSession, principal: Principal, group: Namespace) -> int:
    """The effective role of ``principal`` on ``group``; administrators are Owner."""
    if principal.admin or principal.user_id is None:
        return int(Role.OWNER)
    return await inherited_group_level(session, principal.user_id, group.full_path)


async def require_project_level(session: AsyncSession, principal: Principal, project: Project, needed: Role) -> int:
    """Check ``principal`` has at least ``needed`` on ``project`` and return its level.

    Raises:
        NotFound: the principal has no access at all (GitLab hides private projects: ``404 Project Not Found``).
        Forbidden: the principal can see the project but its role is below ``needed``.
    """
    level = await project_level(session, principal, project)
    if level <= 0:
        raise NotFound("Project")
    if level < needed:
        raise Forbidden(f"403 Forbidden - requires the {Role(needed).label} role or higher")
    return level


async def require_group_level(session: AsyncSession, principal: Principal, group: Namespace, needed: Role) -> int:
    """Check ``principal`` has at least ``needed`` on ``group`` and return its level.

    Raises:
        NotFound: no access at all (``404 Group Not Found``).
        Forbidden: role below ``needed``.
    """
    level = await group_level(session, principal, group)
    if level <= 0:
        raise NotFound("Group")
    if level < needed:
        raise Forbidden(f"403 Forbidden - requires the {Role(needed).label} role or higher")
    return level
