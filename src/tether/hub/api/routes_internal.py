"""The internal API kas calls (kas.md §4.4; ``docs/configuration.md`` "The hub's internal API as kas uses it").

Every call, including one to an unknown internal path, must carry ``Gitlab-Kas-Api-Request: <JWT>`` signed with
the shared secret, ``iss=gitlab-kas``, ``aud=gitlab``; otherwise 401 ``{"message": ...}``. Calls on behalf of an
agent carry its token as ``Authorization: Bearer <token>`` (upstream) and/or ``Gitlab-Agent-Api-Request``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request

from tether.hub.api.internal_auth import JWT_HEADER, check_kas_jwt, kas_jwt_checked
from tether.hub.api.schemas_in import AuthorizeProxyUser, AuthorizeWorkspaceUser
from tether.hub.api.state import hub_state
from tether.hub.errors import NotFound, Unauthorized
from tether.hub.gitaly import repository_for
from tether.hub.service import internal
from tether.hub.workspaces import access as workspace_access

AGENT_TOKEN_HEADER = "Gitlab-Agent-Api-Request"


async def require_kas_jwt(
    request: Request,
    jwt: Annotated[
        str | None, Header(alias=JWT_HEADER, description="HS256 JWT, iss=gitlab-kas, aud=gitlab (raw, no Bearer).")
    ] = None,
) -> None:
    """Check the kas JWT of an internal call, unless the middleware already did.

    :class:`~tether.hub.api.internal_auth.KasJwtMiddleware` checks it before the body is read and marks the
    request; this dependency documents the header in the OpenAPI document and checks it on any route the
    middleware did not cover.

    Raises:
        Unauthorized: missing header, bad signature, expired, wrong issuer or audience.
    """
    if kas_jwt_checked(request.scope):
        return
    problem = check_kas_jwt(jwt, hub_state(request).kas_jwt)
    if problem is not None:
        raise Unauthorized(f"401 Unauthorized - {problem}")


async def agent_token(  # async: FastAPI runs a plain def dependency in a thread pool, a hop per call
    authorization: Annotated[str | None, Header(description="Bearer <agent token>")] = None,
    agent_header: Annotated[str | None, Header(alias=AGENT_TOKEN_HEADER, description="<agent token>")] = None,
) -> str:
    """The agent token from either header.

    Raises:
        Unauthorized: neither header, or the two disagree.
    """
    bearer = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
    if bearer and agent_header and bearer != agent_header:
        raise Unauthorized("401 Unauthorized - the two agent token headers disagree")
    token = agent_header or bearer
    if not token:
        raise Unauthorized("401 Unauthorized - agent token missing")
    return token


router = APIRouter(prefix="/internal", tags=["internal (kas)"], dependencies=[Depends(require_kas_jwt)])
AgentToken = Annotated[str, Depends(agent_token)]


@router.get("/kubernetes/agent_info", summary="Who an agent token belongs to")
async def agent_info(request: Request, token: AgentToken) -> dict[str, Any]:
    """``GetAgentInfoResponse`` JSON; 401 for an unknown or revoked token. Notes the token's ``last_used_at``.

    ``gitaly_info`` and ``gitaly_repository`` are well-formed (upstream kas refuses empty ones): they name the
    hub's Gitaly-compatible configuration service and the project as that service knows it (docs/interop.md).
    """
    state = hub_state(request)
    owner = await internal.agent_for_token(state.db, state.token_uses, token)
    return {
        "project_id": owner.project.id,
        "agent_id": owner.agent.id,
        "agent_name": owner.agent.name,
        "gitaly_info": {"address": state.config.gitaly_address, "token": state.gitaly_token, "features": {}},
        "gitaly_repository": repository_for(owner.project.id, owner.project.full_path),
        "default_branch": owner.project.default_branch,
    }


@router.get("/kubernetes/agent_configuration", summary="The agent's configuration file (Tether)")
async def agent_configuration(request: Request, token: AgentToken) -> dict[str, Any]:
    """``{"commit_id", "configuration", "project_path"}``; ``commit_id`` changes whenever the configuration does."""
    state = hub_state(request)
    doc = await internal.configuration_for_token(state.db, state.token_uses, token)
    return {"commit_id": doc.commit_id, "configuration": doc.document, "project_path": doc.project_path}


@router.post("/kubernetes/authorize_proxy_user", summary="May this user reach the cluster through this agent?")
async def authorize_proxy_user(request: Request, body: AuthorizeProxyUser) -> dict[str, Any]:
    """``AuthorizeProxyUserResponse`` JSON (kas.md §4.5).

    401 bad token, unknown/expired session or wrong CSRF token; 403 not authorized or no ``k8s_proxy`` scope;
    404 unknown agent. kas turns each into 401 for the client.
    """
    async with hub_state(request).db.transaction() as session:
        result = await internal.authorize_proxy_user(
            session, body.agent_id, body.access_type, body.access_key, body.csrf_token
        )
    return result.to_json()


@router.post("/kubernetes/authorize_workspace_user", summary="Does this user own this workspace? (Tether)")
async def authorize_workspace_user(request: Request, body: AuthorizeWorkspaceUser) -> dict[str, Any]:
    """Where the caller's workspace runs and its state (issue 13).

    200 ``{"workspace": {id, name, namespace, service, agent_id, project_id, ports, actual_state,
    desired_state, message}, "user": {id, username}}``; 401 unknown, revoked or expired token, a token without
    ``api``/``read_api``, or a workspace session whose hub session ended; 403 when the caller owns no workspace
    of that name in that zone (it may not exist).
    """
    state = hub_state(request)
    async with state.db.transaction() as session:
        result = await workspace_access.authorize_workspace_user(
            session, body.workspace, body.dns_zone, body.access_type, body.access_key, state.gitlab_secret
        )
    return result.to_json()


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def unknown_internal(rest: str) -> None:
    """Any other internal path: 404, but only after the JWT check."""
    raise NotFound()
