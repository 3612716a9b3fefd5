"""The console's replay of a recorded exec/attach session (issue 25 item 2): ``/-/audit/{id}/recording``.

The page loads asciinema-player (npm, vendored by ``scripts/bootstrap.sh``) and ``recording.js``, which plays
``/-/audit/{id}/recording.cast``: the same file and visibility as ``GET /api/v4/audit_events/{id}/recording``,
with the browser's session instead of a token. A recording the user may not see is "not found", as none.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from tether.hub.api.routes_audit_recordings import ASCIICAST_TYPE, COMPLETE_HEADER
from tether.hub.api.state import hub_state
from tether.hub.console.web import PAGE_HEADERS, ConsoleUser, console_user, render
from tether.hub.service import audit_recordings

router = APIRouter(include_in_schema=False)
#: The console's policy plus ``'wasm-unsafe-eval'``: asciinema-player's terminal emulator is WebAssembly, whose
#: compilation CSP counts as eval. It allows compiling WebAssembly only, not JavaScript ``eval``.
PLAYER_POLICY = PAGE_HEADERS["Content-Security-Policy"].replace(
    "script-src 'self'", "script-src 'self' 'wasm-unsafe-eval'"
)
User_ = Annotated[ConsoleUser, Depends(console_user)]


@router.get("/-/audit/{event_id}/recording", response_class=HTMLResponse)
async def recording_page(request: Request, user: User_, event_id: str) -> HTMLResponse:
    """The player page; 404 (a page in plain words) when the user may not replay this session."""
    state = hub_state(request)
    async with state.db.transaction() as session:
        row = await audit_recordings.readable(session, user.principal, event_id)
        complete, size, stored_at = row.complete, row.size, row.stored_at
    page = render(request, "recording.html", user, event_id=event_id, complete=complete, size=size, stored_at=stored_at)
    page.headers["Content-Security-Policy"] = PLAYER_POLICY
    return page


@router.get("/-/audit/{event_id}/recording.cast")
async def recording_file(request: Request, user: User_, event_id: str) -> Response:
    """The asciicast file the player plays."""
    state = hub_state(request)
    async with state.db.transaction() as session:
        row = await audit_recordings.readable(session, user.principal, event_id)
        content, complete = row.content, row.complete
    return Response(content, media_type=ASCIICAST_TYPE, headers={COMPLETE_HEADER: "true" if complete else "false"})
