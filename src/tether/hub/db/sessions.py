"""Browser sessions (``/users/sign_in``): what kas' session-cookie credential resolves to (kas.md §4.5)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow


class UserSession(Base):
    """A signed-in browser (see :mod:`tether.hub.session_tokens`).

    Neither the session id nor the CSRF token is stored: only their SHA-256 digests, plus the CSRF token sealed
    with the session id so that the cookie's holder can be shown it again.
    """

    __tablename__ = "user_sessions"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    user_id: Mapped[int] = mapped_column(BigId, ForeignKey("users.id", ondelete="CASCADE"), index=True)
    #: Lowercase hex SHA-256 of the session id.
    session_digest: Mapped[str] = mapped_column(String(64), unique=True)
    #: Lowercase hex SHA-256 of the CSRF token.
    csrf_digest: Mapped[str] = mapped_column(String(64))
    #: The CSRF token XOR a key derived from the session id, hex (:func:`tether.hub.session_tokens.seal_csrf`).
    csrf_sealed: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    #: The session stops working at this instant (fixed at sign-in; not extended by use).
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    #: Written on use, at most once a minute.
    last_used_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
