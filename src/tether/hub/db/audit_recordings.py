"""Recorded exec/attach sessions (issue 25 item 2): one asciicast v2 file per audit event id.

Written only by kas' internal ``PUT`` (a second ``PUT`` of the same id replaces it); read by the user API with
the visibility of its event, decided from ``agent_id`` and ``user_id`` so that the recording may arrive before
its event. Plain numbers, not foreign keys: like the audit trail, recordings outlive agents and users.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import UtcDateTime, utcnow


class AuditRecording(Base):
    """The asciicast of the session of audit event ``event_id`` (uuid4 hex made by kas)."""

    __tablename__ = "audit_recordings"

    event_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    agent_id: Mapped[int] = mapped_column(BigInteger, index=True)
    user_id: Mapped[int] = mapped_column(BigInteger, index=True)
    #: False when kas left bytes out (its buffer was full, or the protocol could not be read to the end).
    complete: Mapped[bool] = mapped_column(Boolean)
    size: Mapped[int] = mapped_column(Integer)
    content: Mapped[bytes] = mapped_column(LargeBinary)
    stored_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
