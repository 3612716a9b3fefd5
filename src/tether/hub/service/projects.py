"""Projects: create, list, delete (GitLab ``/projects``).

Rules: a project goes into the caller's personal namespace unless ``namespace_id`` names another; creating one in
a group needs Maintainer there (GitLab's default "project creation protection: Maintainers"); in someone else's
personal namespace only administrators may. The creator becomes a direct member (Owner in their own namespace,
Maintainer in a group). Deleting needs Owner.
"""

from __future__ import annotations

import logging

from sqlalchemy import Select, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.namespaces import KIND_GROUP, GroupMember, Namespace, Project, ProjectMember
from tether.hub.db.types import utcnow
from tether.hub.errors import BadRequest, Conflict, Forbidden, NotFound
from tether.hub.roles import Role
from tether.hub.service.access import group_level, require_project_level
from tether.hub.service.paths import find_namespace, is_under, path_taken
from tether.hub.service.principal import Principal
from tether.hub.validation import check_name, check_path

log = logging.getLogger(__name__)


async def create_project(
    session: AsyncSession,
    principal: Principal,
    name: str | None,
    path: str | None,
    namespace_ref: str | int | None = None,
    description: str = "",
    default_branch: str = "main",
) -> Project:
    """Create a project; ``name`` and ``path`` default to each other (GitLab: one of them is required).

    Raises:
        BadRequest: neither name nor path, or invalid values; no namespace for the CLI operator.
        NotFound: the namespace does not exist or is not visible.
        Forbidden: the principal may not create projects in that namespace.
        Conflict: the full path is taken.
    """
    if not name and not path:
        raise BadRequest("name or path is missing")
    name = check_name(name or str(path))
    path = check_path(path or name.replace(" ", "-").lower())
    if len(description) > 2048:
        raise BadRequest.field("description", "is too long (maximum is 2048 characters)")
    check_path(default_branch, "default_branch")
    namespace = await _target_namespace(session, principal, namespace_ref)
    full_path = f"{namespace.full_path}/{path}"
    if await path_taken(session, full_path):
        raise Conflict({"path": ["has already been taken"], "name": ["has already been taken"]})
    project = Project(
        namespace_id=namespace.id,
        name=name,
        path=path,
        full_path=full_path,
        name_with_namespace=f"{namespace.full_name} / {name}",
        description=description,
        default_branch=default_branch,
        creator_id=principal.user_id,
        created_at=utcnow(),
    )
    session.add(project)
    await session.flush()
    if principal.user_id is not None:
        role = Role.OWNER if namespace.owner_id == principal.user_id else Role.MAINTAINER
        session.add(
            ProjectMember(project_id=project.id, user_id=principal.user_id, access_level=role, created_at=utcnow())
        )
        await session.flush()
    log.info("project %d %s created", project.id, full_path)
    return project


async def _target_namespace(session: AsyncSession, principal: Principal, ref: str | int | None) -> Namespace:
    if ref is None:
        if principal.user_id is None:
            raise BadRequest.field("namespace_id", "is missing")
        namespace = await session.scalar(select(Namespace).where(Namespace.owner_id == principal.user_id))
        if namespace is None:
            raise NotFound("Namespace")
        return namespace
    namespace = await find_namespace(session, ref)
    if namespace.kind == KIND_GROUP:
        level = await group_level(session, principal, namespace)
        if level <= 0:
            raise NotFound("Namespace")
        if level < Role.MAINTAINER:
            raise Forbidden("403 Forbidden - creating projects in this group requires the maintainer role")
    elif not (principal.admin or namespace.owner_id == principal.user_id):
        raise NotFound("Namespace")
    return namespace


def visible_projects_query(principal: Principal, search: str | None = None) -> Select[Project]:
    """Projects the principal is a member of, directly or through a group (administrators: all), by id."""
    query = select(Project).order_by(Project.id)
    if not principal.admin and principal.user_id is not None:
        namespace = Namespace.__table__.alias("project_namespace")
        ancestor = Namespace.__table__.alias("ancestor")
        direct = exists().where(ProjectMember.project_id == Project.id, ProjectMember.user_id == principal.user_id)
        owner = exists().where(namespace.c.id == Project.namespace_id, namespace.c.owner_id == principal.user_id)
        inherited = exists().where(
            GroupMember.user_id == principal.user_id,
            GroupMember.namespace_id == ancestor.c.id,
            is_under(Project.full_path, ancestor.c.full_path),
        )
        query = query.where(or_(direct, owner, inherited))
    if search:
        text = search.lower()
        query = query.where(
            func.lower(Project.full_path).contains(text, autoescape=True)
            | func.lower(Project.name).contains(text, autoescape=True)
        )
    return query


def namespace_projects_query(namespace: Namespace) -> Select[Project]:
    """Projects directly in ``namespace``, by id."""
    return select(Project).where(Project.namespace_id == namespace.id).order_by(Project.id)


async def delete_project(session: AsyncSession, principal: Principal, project: Project) -> None:
    """Delete ``project`` with its members, agents, tokens and configurations (database cascade).

    Raises:
        NotFound, Forbidden: the principal is below Owner.
    """
    await require_project_level(session, principal, project, Role.OWNER)
    await session.delete(project)
    await session.flush()
    log.info("project %d %s deleted", project.id, project.full_path)
