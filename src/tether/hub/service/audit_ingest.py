"""Storing the audit events kas sends (AUDIT_CONTRACT.md, ``POST /api/v4/internal/kubernetes/audit_events``).

Idempotent by event id: kas resends a batch whose answer it did not get (a timeout, a hub restart, its spool
after a crash), and an event already stored is counted as a duplicate, not stored twice. One statement per
batch, ``INSERT ... ON CONFLICT (event_id) DO NOTHING RETURNING event_id``, on PostgreSQL and SQLite alike, so
two hub replicas taking the same batch at once still store each event once.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.audit import AuditEventRow
from tether.hub.db.types import utcnow
from tether.modules.audit.protocol import AuditEvent

_TABLE = cast(Table, AuditEventRow.__table__)


def _row(event: AuditEvent, now: datetime) -> dict[str, Any]:
    identity = event.cluster_identity
    return {
        "event_id": event.id,
        "time": datetime.fromtimestamp(event.time, UTC),
        "received_at": now,
        "kind": event.kind,
        "agent_id": event.agent_id,
        "kas_instance": event.kas_instance,
        "verb": event.verb,
        "status": event.status,
        "duration_ms": event.duration_ms,
        "bytes_in": event.bytes_in,
        "bytes_out": event.bytes_out,
        "user_id": event.user_id,
        "username": event.username,
        "token_id": event.token_id,
        "token_kind": event.token_kind,
        "identity_kind": identity.kind if identity else "",
        "identity_user": identity.user if identity else "",
        "identity_groups": json.dumps(identity.groups) if identity and identity.groups else "",
        "api_group": event.api_group,
        "api_version": event.api_version,
        "resource": event.resource,
        "subresource": event.subresource,
        "namespace": event.namespace,
        "name": event.name,
        "path": event.path,
        "request_id": event.request_id,
        "source_address": event.source_address,
        "recording": event.recording,
    }


async def store(session: AsyncSession, events: list[AuditEvent]) -> int:
    """Insert the events not yet stored, in the caller's transaction; returns how many were new.

    Args:
        session: an open transaction (the caller commits).
        events: checked events (:func:`tether.modules.audit.hub.batch.decode_batch`), ids unique in the list.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused the statement (nothing of the batch is stored).
    """
    if not events:
        return 0
    now = utcnow()
    rows = [_row(event, now) for event in events]
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(_TABLE).on_conflict_do_nothing(index_elements=["event_id"]).returning(_TABLE.c.event_id)
    result = await session.execute(statement, rows)
    return len(result.all())
