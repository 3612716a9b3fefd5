"""Namespaces (personal namespaces and groups), projects and memberships with GitLab's roles."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow

KIND_USER = "user"
KIND_GROUP = "group"


class Namespace(Base):
    """A place projects live in: a user's personal namespace (``kind='user'``) or a group (``kind='group'``).

    Groups nest through ``parent_id``. ``full_path`` (``a/b/c``) and ``full_name`` (``A / B / C``) are stored
    because paths never change once created (the hub has no rename).
    """

    __tablename__ = "namespaces"
    __table_args__ = (UniqueConstraint("parent_id", "path"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))
    name: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(255))
    full_path: Mapped[str] = mapped_column(String(2048), unique=True)
    full_name: Mapped[str] = mapped_column(String(4096))
    description: Mapped[str] = mapped_column(String(2048), default="")
    parent_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("namespaces.id", ondelete="CASCADE"), index=True)
    #: The owner of a personal namespace; None for groups.
    owner_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class Project(Base):
    """A project: the home of cluster agents (upstream: the agent's configuration project)."""

    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("namespace_id", "path"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    namespace_id: Mapped[int] = mapped_column(BigId, ForeignKey("namespaces.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(String(255))
    full_path: Mapped[str] = mapped_column(String(2048), unique=True)
    name_with_namespace: Mapped[str] = mapped_column(String(4096))
    description: Mapped[str] = mapped_column(String(2048), default="")
    default_branch: Mapped[str] = mapped_column(String(255), default="main")
    creator_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ProjectMember(Base):
    """A user's direct role in a project (``access_level``: 10 Guest ... 50 Owner)."""

    __tablename__ = "project_members"
    __table_args__ = (UniqueConstraint("project_id", "user_id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    project_id: Mapped[int] = mapped_column(BigId, ForeignKey("projects.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"), index=True)
    access_level: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class GroupMember(Base):
    """A user's direct role in a group; it is inherited by the group's subgroups and projects."""

    __tablename__ = "group_members"
    __table_args__ = (UniqueConstraint("namespace_id", "user_id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    namespace_id: Mapped[int] = mapped_column(BigId, ForeignKey("namespaces.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"), index=True)
    access_level: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
