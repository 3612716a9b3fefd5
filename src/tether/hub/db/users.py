"""People and their personal access tokens (GitLab's ``users`` and ``personal_access_tokens``)."""

from __future__ import annotations

from datetime import date, datetime

from sqlalchemy import JSON, Boolean, Date, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow


class User(Base):
    """A person (or a bot) who uses the REST API and the Kubernetes API proxy.

    Every user owns a personal namespace whose path is the username (see :mod:`tether.hub.db.namespaces`).
    """

    __tablename__ = "users"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    username: Mapped[str] = mapped_column(String(255), unique=True)
    name: Mapped[str] = mapped_column(String(255))
    email: Mapped[str | None] = mapped_column(String(255), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    #: ``active`` or ``blocked``; blocked users cannot authenticate.
    state: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class PersonalAccessToken(Base):
    """A user's token for the REST API (``api``, ``read_api``) and the Kubernetes API proxy (``k8s_proxy``).

    Only the SHA-256 digest of the token is stored; the plain token is shown once, when created.
    """

    __tablename__ = "personal_access_tokens"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(String(255), default="")
    #: Lowercase hex SHA-256 of the plain token.
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    #: Sorted list of scope names.
    scopes: Mapped[list[str]] = mapped_column(JSON)
    #: The token stops working at 00:00 UTC on this date; None means it never expires.
    expires_at: Mapped[date | None] = mapped_column(Date)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
