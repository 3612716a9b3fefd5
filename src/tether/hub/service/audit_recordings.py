"""Recorded exec/attach sessions (issue 25 item 2): stored for kas, read with the visibility of audit events.

Visibility is the audit trail's (AUDIT_CONTRACT.md): an administrator reads every recording; a user reads those of
their own sessions and those of agents in projects where they are at least Maintainer. Anyone else gets 404, as
for a recording that does not exist, so that ids of other users' sessions are not confirmed.
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from tether.hub.db.audit_recordings import AuditRecording
from tether.hub.db.types import utcnow
from tether.hub.errors import BadRequest, NotFound
from tether.hub.service.audit_query import maintained_agent_ids
from tether.hub.service.principal import Principal

__all__ = ["EVENT_ID", "check_event_id", "delete_older", "readable", "store"]

#: An audit event id: uuid4 as 32 lowercase hex digits (made by kas).
EVENT_ID = re.compile(r"^[0-9a-f]{32}$")


def check_event_id(event_id: str) -> str:
    """Return ``event_id`` when it is an audit event id.

    Raises:
        BadRequest: not 32 lowercase hex digits.
    """
    if not EVENT_ID.fullmatch(event_id):
        raise BadRequest.field("id", "must be an audit event id (32 lowercase hex digits)")
    return event_id


async def store(
    session: AsyncSession, event_id: str, agent_id: int, user_id: int, complete: bool, content: bytes
) -> None:
    """Store (or replace: kas may send it again) the recording of audit event ``event_id``."""
    row = await session.get(AuditRecording, event_id)
    if row is None:
        row = AuditRecording(event_id=event_id)
        session.add(row)
    row.agent_id = agent_id
    row.user_id = user_id
    row.complete = complete
    row.size = len(content)
    row.content = content
    row.stored_at = utcnow()


async def delete_older(session: AsyncSession, cutoff: datetime, chunk: int) -> int:
    """Delete at most ``chunk`` recordings stored before ``cutoff`` (the audit retention); returns how many."""
    doomed = select(AuditRecording.event_id).where(AuditRecording.stored_at < cutoff).limit(chunk)
    result = await session.execute(delete(AuditRecording).where(AuditRecording.event_id.in_(doomed)))
    return int(getattr(result, "rowcount", 0) or 0)


async def readable(session: AsyncSession, principal: Principal, event_id: str) -> AuditRecording:
    """The recording of ``event_id`` if ``principal`` may replay it.

    Raises:
        NotFound: no such recording, or one ``principal`` may not see (the same answer).
    """
    row = await session.get(AuditRecording, event_id) if EVENT_ID.fullmatch(event_id) else None
    if row is None or not await _visible(session, principal, row):
        raise NotFound("Recording")
    return row


async def _visible(session: AsyncSession, principal: Principal, row: AuditRecording) -> bool:
    if principal.admin or principal.user_id is None:
        return True
    if row.user_id and row.user_id == principal.user_id:
        return True
    return row.agent_id in await maintained_agent_ids(session, principal.user_id)
