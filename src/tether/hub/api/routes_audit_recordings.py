"""Recorded exec/attach sessions (issue 25 item 2): kas stores them, users replay them.

* ``PUT /api/v4/internal/kubernetes/audit_events/{id}/recording`` (kas JWT, AUDIT_CONTRACT.md): the body is the
  asciicast v2 file (``Content-Type: application/x-asciicast``), ``Tether-Recording-Complete: true|false``,
  ``Tether-Agent-Id`` and ``Tether-User-Id`` (Tether additions: who may replay it, known before the event
  arrives); 204. A second ``PUT`` of the same id replaces the file. A body over ``audit.recording_max_bytes``
  gets 413 before it is read whole; a malformed id or header 400; nothing is stored then.
* ``GET /api/v4/audit_events/{id}/recording``: the file, with the visibility of audit events
  (:mod:`tether.hub.service.audit_recordings`); 404 for a recording the caller may not see, as for none.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response

from tether.hub.api.auth import Reader
from tether.hub.api.deps import State
from tether.hub.api.routes_internal import require_kas_jwt
from tether.hub.errors import BadRequest, HubError
from tether.hub.service import audit_recordings
from tether.tool.ids import MAX_ID

__all__ = ["ASCIICAST_TYPE", "COMPLETE_HEADER", "internal_router", "router"]

#: The media type of an asciicast file.
ASCIICAST_TYPE = "application/x-asciicast"
#: Whether the file holds the whole session.
COMPLETE_HEADER = "Tether-Recording-Complete"

internal_router = APIRouter(
    prefix="/internal/kubernetes", tags=["internal (kas)"], dependencies=[Depends(require_kas_jwt)]
)
router = APIRouter(tags=["audit events"])


class RecordingTooLarge(HubError):
    """413: the recording is over ``audit.recording_max_bytes``."""

    status = 413


def _id_header(value: str, name: str) -> int:
    if not value.isdigit() or int(value) > MAX_ID:
        raise BadRequest.field(name, "must be a non-negative 64-bit integer")
    return int(value)


async def _body(request: Request, limit: int) -> bytes:
    too_large = RecordingTooLarge(f"413 Request Entity Too Large - a recording is at most {limit} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise too_large
    return bytes(raw)


@internal_router.put("/audit_events/{event_id}/recording", status_code=204, summary="Store a session recording")
async def put_recording(
    request: Request,
    state: State,
    event_id: str,
    complete: Annotated[str, Header(alias=COMPLETE_HEADER)] = "",
    agent_id: Annotated[str, Header(alias="Tether-Agent-Id")] = "",
    user_id: Annotated[str, Header(alias="Tether-User-Id")] = "0",
) -> Response:
    """Store the asciicast of audit event ``event_id`` (kas, after the session ended).

    Raises:
        BadRequest: a malformed id, ``Tether-Recording-Complete`` not ``true``/``false``, or malformed ids.
        RecordingTooLarge: the body is over ``audit.recording_max_bytes``.
    """
    audit_recordings.check_event_id(event_id)
    if complete not in ("true", "false"):
        raise BadRequest.field(COMPLETE_HEADER, "must be true or false")
    agent = _id_header(agent_id, "Tether-Agent-Id")
    user = _id_header(user_id, "Tether-User-Id")
    content = await _body(request, state.config.audit.recording_max_bytes)
    async with state.db.transaction() as session:
        await audit_recordings.store(session, event_id, agent, user, complete == "true", content)
    return Response(status_code=204)


@router.get("/audit_events/{event_id}/recording", summary="Replay file of a recorded exec/attach session")
async def get_recording(state: State, principal: Reader, event_id: str) -> Response:
    """The asciicast v2 file; ``Tether-Recording-Complete`` says whether it holds the whole session.

    Who may read it: an administrator, the user of the session, Maintainers of the agent's project; 404 otherwise.
    """
    async with state.db.transaction() as session:
        row = await audit_recordings.readable(session, principal, event_id)
        content, complete = row.content, row.complete
    return Response(content, media_type=ASCIICAST_TYPE, headers={COMPLETE_HEADER: "true" if complete else "false"})
