"""``GET /api/v4/audit_events`` and ``GET /api/v4/audit_events.jsonl``: the audit trail (issue 25 item 1).

Filters (both routes): ``user_id``, ``agent_id``, ``verb``, ``resource``, ``namespace`` (exact), ``since`` and
``until`` (event time, ISO 8601 or unix seconds, ``since`` inclusive, ``until`` exclusive). The list is newest
first with GitLab's offset pagination; the JSON lines export is in arrival order, one event per line, streamed,
and ``after=<cursor>`` continues after the last line a reader kept (an event kas spooled during a hub outage
arrives late with an early ``time``: a ``since`` cursor would skip it, ``after`` does not). Who sees what:
:mod:`tether.hub.service.audit_query`. Scope ``api`` or ``read_api``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import ColumnElement

from tether.hub.api.auth import Reader
from tether.hub.api.deps import Paging, State
from tether.hub.api.pagination import fetch_page_capped, set_headers, set_headers_uncounted
from tether.hub.db.engine import Database
from tether.hub.errors import BadRequest
from tether.hub.ids import RowId
from tether.hub.service import audit_query
from tether.hub.service.audit_query import AuditFilter
from tether.modules.audit.hub.times import parse_time
from tether.tool.ids import MAX_ID

router = APIRouter(tags=["audit events"])
#: Rows one read of the export takes (each read is its own short transaction).
EXPORT_CHUNK = 1000
_Text = Annotated[str, Query(max_length=253)]
_Time = Annotated[str | None, Query(max_length=64, description="ISO 8601 or unix seconds.")]


def audit_filter(
    user_id: Annotated[RowId | None, Query(description="Events made with this user's identity.")] = None,
    agent_id: Annotated[RowId | None, Query(description="Events through this agent.")] = None,
    verb: _Text = "",
    resource: _Text = "",
    namespace: _Text = "",
    since: _Time = None,
    until: _Time = None,
) -> AuditFilter:
    """FastAPI dependency: the filters of both routes.

    Raises:
        BadRequest: ``since`` or ``until`` is not a time.
    """
    try:
        since_at = parse_time(since, "since") if since else None
        until_at = parse_time(until, "until") if until else None
    except ValueError as exc:
        raise BadRequest(f"400 Bad request - {exc}") from None
    return AuditFilter(
        user_id=user_id,
        agent_id=agent_id,
        verb=verb,
        resource=resource,
        namespace=namespace,
        since=since_at,
        until=until_at,
    )


Filter = Annotated[AuditFilter, Depends(audit_filter)]


@router.get("/audit_events", summary="List audit events")
async def list_audit_events(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, wanted: Filter
) -> list[dict[str, Any]]:
    """Newest first. Administrators see every event; others their own and those of agents they maintain."""
    async with state.db.transaction(read_only=True) as session:
        allowed = await audit_query.visible(session, principal)
        rows, total = await fetch_page_capped(session, audit_query.events_query(wanted, allowed, True), paging)
    if total is None:
        rows = set_headers_uncounted(request, response, paging, rows)
    else:
        set_headers(request, response, paging, total)
    return [audit_query.event_json(row) for row in rows]


async def _lines(db: Database, wanted: AuditFilter, allowed: ColumnElement[bool] | None) -> AsyncIterator[bytes]:
    encode = msgspec.json.Encoder().encode
    while True:
        async with db.transaction(read_only=True) as session:
            query = audit_query.events_query(wanted, allowed, False).limit(EXPORT_CHUNK)
            rows = list(await session.scalars(query))
        if not rows:
            return
        yield b"".join(encode(audit_query.event_json(row)) + b"\n" for row in rows)
        if len(rows) < EXPORT_CHUNK:
            return
        wanted = AuditFilter(**{**wanted.__dict__, "after": rows[-1].seq})


@router.get(
    "/audit_events.jsonl",
    summary="Export audit events as JSON lines (for a SIEM)",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-ndjson": {}}}},
)
async def export_audit_events(
    state: State,
    principal: Reader,
    wanted: Filter,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="Only events after this cursor (a line's ``cursor``).")
    ] = None,
) -> StreamingResponse:
    """One event per line in arrival order, with the same visibility and filters as the list."""
    async with state.db.transaction(read_only=True) as session:
        allowed = await audit_query.visible(session, principal)
    wanted = AuditFilter(**{**wanted.__dict__, "after": after})
    return StreamingResponse(_lines(state.db, wanted, allowed), media_type="application/x-ndjson")
