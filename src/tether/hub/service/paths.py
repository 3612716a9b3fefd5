"""Resolution of GitLab-style references: a numeric id or a full path (``group/sub/project``).

Paths are unique case-insensitively across namespaces (users' and groups') and projects, as GitLab's routes are.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from tether.hub.db.namespaces import KIND_GROUP, Namespace, Project
from tether.hub.errors import NotFound
from tether.tool.ids import is_ascii_number, parse_id


def is_under(
    child_path: ColumnElement[str] | InstrumentedAttribute[str], ancestor_path: ColumnElement[str]
) -> ColumnElement[bool]:
    """SQL: ``child_path`` lies strictly below ``ancestor_path`` (``a/b/c`` under ``a/b``).

    A prefix comparison with ``substr`` rather than ``LIKE``, because paths may contain ``_``, a LIKE wildcard.
    """
    return func.substr(child_path, 1, func.length(ancestor_path) + 1) == ancestor_path + "/"


async def path_taken(session: AsyncSession, full_path: str) -> bool:
    """True when a namespace or a project already uses ``full_path`` (case-insensitive)."""
    lowered = full_path.lower()
    if await session.scalar(select(Namespace.id).where(func.lower(Namespace.full_path) == lowered)) is not None:
        return True
    return await session.scalar(select(Project.id).where(func.lower(Project.full_path) == lowered)) is not None


async def find_project(session: AsyncSession, ref: str | int) -> Project:
    """The project with numeric id ``ref`` or full path ``ref`` (case-insensitive).

    Raises:
        NotFound: ``404 Project Not Found``.
    """
    if isinstance(ref, int) or is_ascii_number(ref):
        row_id = parse_id(ref)
        project = await session.get(Project, row_id) if row_id is not None else None
    else:
        project = await session.scalar(select(Project).where(func.lower(Project.full_path) == ref.lower()))
    if project is None:
        raise NotFound("Project")
    return project


async def find_namespace(session: AsyncSession, ref: str | int) -> Namespace:
    """The namespace (user or group) with numeric id or full path ``ref``.

    Raises:
        NotFound: ``404 Namespace Not Found``.
    """
    if isinstance(ref, int) or is_ascii_number(ref):
        row_id = parse_id(ref)
        namespace = await session.get(Namespace, row_id) if row_id is not None else None
    else:
        namespace = await session.scalar(select(Namespace).where(func.lower(Namespace.full_path) == ref.lower()))
    if namespace is None:
        raise NotFound("Namespace")
    return namespace


async def find_group(session: AsyncSession, ref: str | int) -> Namespace:
    """The group with numeric id or full path ``ref``.

    Raises:
        NotFound: ``404 Group Not Found`` (also for a user's personal namespace).
    """
    try:
        namespace = await find_namespace(session, ref)
    except NotFound:
        raise NotFound("Group") from None
    if namespace.kind != KIND_GROUP:
        raise NotFound("Group")
    return namespace
