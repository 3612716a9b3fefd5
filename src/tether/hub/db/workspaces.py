"""Workspaces and the per-agent workspaces settings (reference §6.1, §6.3; seed 003)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow


class WorkspacesAgentConfig(Base):
    """One version of an agent's workspaces settings; a new row whenever the agent's configuration changes them.

    ``settings`` is :class:`~tether.modules.remote_development.hub.settings.WorkspacesSettings` as JSON; the
    columns repeat the fields the hub queries.
    """

    __tablename__ = "workspaces_agent_configs"
    __table_args__ = (UniqueConstraint("cluster_agent_id", "version"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    cluster_agent_id: Mapped[int] = mapped_column(BigId, ForeignKey("cluster_agents.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    enabled: Mapped[bool] = mapped_column(Boolean)
    dns_zone: Mapped[str] = mapped_column(String(256))
    max_active_hours_before_stop: Mapped[int] = mapped_column(Integer, default=36)
    max_stopped_hours_before_termination: Mapped[int] = mapped_column(Integer, default=744)
    workspaces_quota: Mapped[int] = mapped_column(Integer, default=-1)
    workspaces_per_user_quota: Mapped[int] = mapped_column(Integer, default=-1)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class Workspace(Base):
    """A workspace: desired state set by its owner, actual state reported by agentk (reference §6.1).

    ``*_updated_at`` change with their state (set by the service layer, as upstream's ``before_save``);
    ``responded_to_agent_at`` is None until the workspace was first sent to agentk;
    ``actual_state_message`` is Tether's readable reason for ``Failed`` and ``Error``.
    """

    __tablename__ = "workspaces"
    __table_args__ = (
        UniqueConstraint("cluster_agent_id", "name"),
        Index("ix_workspaces_user_id", "user_id"),
        Index("ix_workspaces_project_id", "project_id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"))
    project_id: Mapped[int] = mapped_column(BigId, ForeignKey("projects.id", ondelete="CASCADE"))
    cluster_agent_id: Mapped[int] = mapped_column(BigId, ForeignKey("cluster_agents.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    namespace: Mapped[str] = mapped_column(String(64))
    desired_state: Mapped[str] = mapped_column(String(32))
    desired_state_updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    actual_state: Mapped[str] = mapped_column(String(32))
    actual_state_updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    actual_state_message: Mapped[str] = mapped_column(Text, default="")
    responded_to_agent_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    deployment_resource_version: Mapped[str | None] = mapped_column(String(64))
    force_include_all_resources: Mapped[bool] = mapped_column(Boolean, default=True)
    project_ref: Mapped[str] = mapped_column(String(256))
    devfile_path: Mapped[str | None] = mapped_column(String(2048))
    devfile: Mapped[str] = mapped_column(Text)
    url_prefix: Mapped[str] = mapped_column(String(256))
    workspaces_agent_config_version: Mapped[int] = mapped_column(Integer)
    #: Upstream keeps the column for the deprecated field; the lifecycle rules use the agent settings.
    max_hours_before_termination: Mapped[int] = mapped_column(Integer, default=8760)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)
