"""Agent token revocations not yet acknowledged by a kas (issue 26 item 2)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Text
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow


class PendingRevocation(Base):
    """A revocation to deliver to kas, written in the transaction that revokes the tokens.

    The replica that committed it delivers it at once and deletes the row once a kas acknowledges; if that
    replica dies first, any replica's sweep delivers it after ``next_attempt_at``.
    """

    __tablename__ = "pending_revocations"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    agent_id: Mapped[int] = mapped_column(BigInteger)
    #: The revoked tokens' SHA-256 digests, lowercase hex, separated by commas.
    token_digests: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    #: No sweep tries before this instant (the committing replica's own delivery has it until then).
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
