"""Cluster agents, their tokens and their configuration document."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow

TOKEN_ACTIVE = "active"
TOKEN_REVOKED = "revoked"


class ClusterAgent(Base):
    """An agent registered in a project; ``name`` is a DNS label (≤ 63 chars), unique in its project."""

    __tablename__ = "cluster_agents"
    __table_args__ = (UniqueConstraint("project_id", "name"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    project_id: Mapped[int] = mapped_column(BigId, ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(63))
    created_by_user_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ClusterAgentToken(Base):
    """One of an agent's tokens (several allow rotation). Stored as a SHA-256 digest; revocable."""

    __tablename__ = "cluster_agent_tokens"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    agent_id: Mapped[int] = mapped_column(BigId, ForeignKey("cluster_agents.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(String(1024), default="")
    #: Lowercase hex SHA-256 of the plain token.
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    #: ``active`` or ``revoked``.
    status: Mapped[str] = mapped_column(String(16), default=TOKEN_ACTIVE)
    created_by_user_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("users.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class AgentConfiguration(Base):
    """An agent's configuration file (upstream ``.gitlab/agents/<name>/config.yaml``).

    ``content`` is the YAML as written; ``document`` is the validated ``ConfigurationFile`` as protobuf JSON with
    the original snake_case field names; ``version`` grows by one on every change.
    """

    __tablename__ = "agent_configurations"

    agent_id: Mapped[int] = mapped_column(BigId, ForeignKey("cluster_agents.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    content: Mapped[str] = mapped_column(Text)
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_by_user_id: Mapped[int | None] = mapped_column(BigId, ForeignKey("users.id", ondelete="SET NULL"))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
