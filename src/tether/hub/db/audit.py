"""Audit events: one row per request kas relayed to an agent or refused (issue 25 item 1).

Rows are written only by the internal ingestion endpoint and deleted only by the retention sweep
(``audit.retention_days``). ``agent_id``, ``user_id`` and ``token_id`` are plain numbers, not foreign keys: the
trail outlives the agents, users and tokens it names.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from tether.hub.db.base import Base
from tether.hub.db.types import BigId, UtcDateTime, utcnow


class AuditEventRow(Base):
    """An :class:`~tether.modules.audit.protocol.AuditEvent` as stored.

    ``seq`` orders rows by arrival (the JSON lines export's cursor); ``event_id`` is kas' id, unique, so a
    batch delivered twice stores each event once. The cluster identity is flattened into ``identity_*``
    (``identity_groups``: JSON list as text).
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_time", "time"),
        Index("ix_audit_events_user_id_time", "user_id", "time"),
        Index("ix_audit_events_agent_id_time", "agent_id", "time"),
        Index("ix_audit_events_namespace_time", "namespace", "time"),
        Index("ix_audit_events_resource_time", "resource", "time"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(BigId, primary_key=True)
    event_id: Mapped[str] = mapped_column(String(32), unique=True)
    time: Mapped[datetime] = mapped_column(UtcDateTime)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    agent_id: Mapped[int] = mapped_column(BigInteger)
    kas_instance: Mapped[str] = mapped_column(String(255))
    verb: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    duration_ms: Mapped[float] = mapped_column(Float)
    bytes_in: Mapped[int] = mapped_column(BigInteger)
    bytes_out: Mapped[int] = mapped_column(BigInteger)
    user_id: Mapped[int] = mapped_column(BigInteger)
    username: Mapped[str] = mapped_column(String(255))
    token_id: Mapped[int] = mapped_column(BigInteger)
    token_kind: Mapped[str] = mapped_column(String(32))
    identity_kind: Mapped[str] = mapped_column(String(32))
    identity_user: Mapped[str] = mapped_column(String(255))
    identity_groups: Mapped[str] = mapped_column(Text)
    api_group: Mapped[str] = mapped_column(String(253))
    api_version: Mapped[str] = mapped_column(String(64))
    resource: Mapped[str] = mapped_column(String(253))
    subresource: Mapped[str] = mapped_column(String(253))
    namespace: Mapped[str] = mapped_column(String(253))
    name: Mapped[str] = mapped_column(String(253))
    path: Mapped[str] = mapped_column(Text)
    request_id: Mapped[str] = mapped_column(String(128))
    source_address: Mapped[str] = mapped_column(String(128))
    recording: Mapped[str] = mapped_column(String(16))
