"""``POST /api/v4/internal/kubernetes/audit_events``: kas hands the hub a batch of audit events (issue 25 item 1).

Contract (AUDIT_CONTRACT.md): kas JWT (checked by :class:`~tether.hub.api.internal_auth.KasJwtMiddleware` before
the body is read); body ``{"events": [AuditEvent, ...]}``, at most 1,000 events and 4 MiB; answer
``200 {"accepted": n, "duplicates": m}``, where a duplicate is an event whose id is already stored (or repeated
in the batch). A malformed batch gets ``400 {"message": "<field>: <problem>"}`` and nothing of it is stored; a
body over 4 MiB gets 413 before it is read whole.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from tether.hub.api.routes_internal import require_kas_jwt
from tether.hub.api.state import hub_state
from tether.hub.errors import BadRequest, HubError
from tether.hub.service import audit_ingest
from tether.modules.audit.hub.batch import MAX_BATCH_BYTES, BatchError, decode_batch

router = APIRouter(prefix="/internal/kubernetes", tags=["internal (kas)"], dependencies=[Depends(require_kas_jwt)])


class BatchTooLarge(HubError):
    """413: the batch's body is over :data:`~tether.modules.audit.hub.batch.MAX_BATCH_BYTES`."""

    status = 413


_TOO_LARGE = f"413 Request Entity Too Large - an audit batch is at most {MAX_BATCH_BYTES} bytes"


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BATCH_BYTES:
        raise BatchTooLarge(_TOO_LARGE)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BATCH_BYTES:
            raise BatchTooLarge(_TOO_LARGE)
    return bytes(raw)


@router.post("/audit_events", summary="Store a batch of audit events (kas, Tether)")
async def ingest_audit_events(request: Request) -> dict[str, Any]:
    """``{"accepted": n, "duplicates": m}``: ``n`` events stored now, ``m`` already stored or repeated.

    Raises:
        BadRequest: the batch is malformed (the message names the field); nothing is stored.
        BatchTooLarge: the body is over 4 MiB.
    """
    try:
        events, received = decode_batch(await _body(request))
    except BatchError as exc:
        raise BadRequest(f"400 Bad request - {exc}") from None
    state = hub_state(request)
    async with state.db.transaction() as session:
        accepted = await audit_ingest.store(session, events)
    return {"accepted": accepted, "duplicates": received - accepted}
