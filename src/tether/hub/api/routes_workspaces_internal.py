"""The ``remote_development`` module's internal route: agentk's reconcile request, carried through kas.

``POST /api/v4/internal/kubernetes/modules/remote_development/reconcile`` (reference §1): kas JWT (checked by
:class:`~tether.hub.api.internal_auth.KasJwtMiddleware` first), then the agent token; 201 with
``{workspace_rails_infos, settings}``; a body breaking the schema gets 400
``{"message": {"error": "Workspace reconcile params validation failed: ..."}}`` (upstream answers 500 with the
same body, reference §1.5).
"""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from tether.hub.api.connections import announce_workspace_changes
from tether.hub.api.routes_internal import AgentToken, require_kas_jwt
from tether.hub.api.state import hub_state
from tether.hub.service import internal
from tether.hub.workspaces.reconcile import reconcile
from tether.modules.remote_development import MODULE_NAME
from tether.modules.remote_development.hub.params import ERROR_PREFIX, ParamsError

#: Largest reconcile body accepted: a full sync of a few thousand workspaces with their Deployments.
MAX_BODY_BYTES = 64 * 1024 * 1024

router = APIRouter(
    prefix=f"/internal/kubernetes/modules/{MODULE_NAME}",
    tags=["internal (kas)"],
    dependencies=[Depends(require_kas_jwt)],
)


def _bad(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"message": {"error": message}}, status_code=status)


@router.post("/reconcile", status_code=201, summary="Workspaces reconciliation (agentk via kas)")
async def reconcile_route(request: Request, token: AgentToken) -> Any:
    """Persist the actual state agentk reports and answer with what it must apply (reference §1.3-§1.5)."""
    state = hub_state(request)
    owner = await internal.agent_for_token(state.db, state.token_uses, token)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return _bad(f"{ERROR_PREFIX}body larger than {MAX_BODY_BYTES} bytes", 413)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            return _bad(f"{ERROR_PREFIX}body larger than {MAX_BODY_BYTES} bytes", 413)
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        return _bad(f"{ERROR_PREFIX}body is not valid JSON: {exc}")
    changed: list[str] = []
    try:
        async with state.db.transaction() as session:
            answer = await reconcile(session, owner.agent.id, body, changed, state.config.kas.workspaces_url)
    except ParamsError as exc:
        return _bad(str(exc))
    await announce_workspace_changes(state, changed)  # after the commit: kas re-reads what it asks next
    # msgspec: a full sync's answer can be megabytes of config.
    return Response(msgspec.json.encode(answer), status_code=201, media_type="application/json")
