"""Storing the audit events kas sends (AUDIT_CONTRACT.md, ``POST /api/v4/internal/kubernetes/audit_events``).

Idempotent by event id: kas resends a batch whose answer it did not get (a timeout, a hub restart, its spool
after a crash), and an event already stored is counted as a duplicate, not stored twice. One statement per
batch, ``INSERT ... ON CONFLICT (event_id) DO NOTHING RETURNING event_id``, on PostgreSQL and SQLite alike, so
two hub replicas taking the same batch at once still store each event once.

On PostgreSQL the batch goes as one array per column (``INSERT ... SELECT ... FROM unnest(CAST(:event_id AS
text[]), ...)``): SQLAlchemy's per-row parameter handling of a many-row INSERT cost more than the database's
work (profile of ``bench/audit_hub.py``, docs/benchmarks.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, cast

import msgspec
from sqlalchemy import Table, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.audit import AuditEventRow
from tether.hub.db.types import utcnow
from tether.modules.audit.protocol import AuditEvent, ClusterIdentity

_TABLE = cast(Table, AuditEventRow.__table__)
#: The columns an event gives as they are (column = :class:`AuditEvent` field), with their PostgreSQL types.
_PG_PLAIN = {
    "kind": "text",
    "agent_id": "int8",
    "kas_instance": "text",
    "verb": "text",
    "status": "int4",
    "duration_ms": "float8",
    "bytes_in": "int8",
    "bytes_out": "int8",
    "user_id": "int8",
    "username": "text",
    "token_id": "int8",
    "token_kind": "text",
    "api_group": "text",
    "api_version": "text",
    "resource": "text",
    "subresource": "text",
    "namespace": "text",
    "name": "text",
    "path": "text",
    "request_id": "text",
    "source_address": "text",
    "recording": "text",
}
#: Every array parameter: the event id, its time as unix seconds, the flattened identity, then the plain ones.
_PG_ARRAYS = {
    "event_id": "text",
    "time": "float8",
    "identity_kind": "text",
    "identity_user": "text",
    "identity_groups": "text",
    **_PG_PLAIN,
}
_PG_INSERT = text(
    f"INSERT INTO audit_events (received_at, {', '.join(_PG_ARRAYS)}) "
    f"SELECT now(), u.event_id, to_timestamp(u.time), {', '.join(f'u.{c}' for c in list(_PG_ARRAYS)[2:])} "
    f"FROM unnest({', '.join(f'CAST(:{c} AS {t}[])' for c, t in _PG_ARRAYS.items())}) "
    f"AS u({', '.join(_PG_ARRAYS)}) "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
_encode = msgspec.json.Encoder().encode


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
        "identity_groups": _groups(identity),
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
    if session.get_bind().dialect.name == "postgresql":
        return await _store_postgresql(session, events)
    now = utcnow()
    rows = [_row(event, now) for event in events]
    statement = sqlite.insert(_TABLE).on_conflict_do_nothing(index_elements=["event_id"]).returning(_TABLE.c.event_id)
    result = await session.execute(statement, rows)
    return len(result.all())


def _groups(identity: ClusterIdentity | None) -> str:
    return _encode(identity.groups).decode() if identity and identity.groups else ""


async def _store_postgresql(session: AsyncSession, events: list[AuditEvent]) -> int:
    # Column by column with C-level attrgetter: no row dicts, and PostgreSQL makes the timestamps.
    identities = [event.cluster_identity for event in events]
    columns = [
        list(map(attrgetter("id"), events)),
        list(map(attrgetter("time"), events)),
        [identity.kind if identity else "" for identity in identities],
        [identity.user if identity else "" for identity in identities],
        list(map(_groups, identities)),
        *(list(map(attrgetter(name), events)) for name in _PG_PLAIN),
    ]
    # 27 parameters, each an array: SQLAlchemy handles a few values, asyncpg encodes the arrays.
    stored = (await session.execute(_PG_INSERT, dict(zip(_PG_ARRAYS, columns, strict=True)))).all()
    return len(stored)
