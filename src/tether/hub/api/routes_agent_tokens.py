"""``/projects/:id/cluster_agents/:agent_id/tokens`` (GitLab "Agent tokens API")."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tether.hub.api.auth import Reader, Writer
from tether.hub.api.connections import announce_revoked_tokens, record_revocation
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import fetch_page, set_headers
from tether.hub.api.schemas_in import AgentTokenCreate
from tether.hub.api.schemas_out import AgentTokenCreated, AgentTokenOut, agent_token_out
from tether.hub.ids import RowId
from tether.hub.roles import Role
from tether.hub.service import agents
from tether.hub.service.paths import find_project

router = APIRouter(tags=["cluster agent tokens"])
_BASE = "/projects/{project_id}/cluster_agents/{agent_id}/tokens"


@router.get(_BASE, summary="List an agent's active tokens")
async def list_tokens(
    request: Request,
    response: Response,
    state: State,
    principal: Reader,
    paging: Paging,
    project_id: str,
    agent_id: RowId,
) -> list[AgentTokenOut]:
    """Developer or above; revoked tokens are not listed."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id)
        items, total = await fetch_page(session, agents.active_tokens_query(agent), paging)
    set_headers(request, response, paging, total)
    return [agent_token_out(t) for t in items]


@router.get(_BASE + "/{token_id}", summary="Get an agent token")
async def get_token(
    state: State, principal: Reader, project_id: str, agent_id: RowId, token_id: RowId
) -> AgentTokenOut:
    """Developer or above; 404 for a revoked token."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id)
        return agent_token_out(await agents.get_token(session, agent, token_id))


@router.post(_BASE, status_code=201, summary="Create an agent token")
async def create_token(
    state: State, principal: Writer, project_id: str, agent_id: RowId, body: AgentTokenCreate
) -> AgentTokenCreated:
    """Maintainer or above. The answer holds the plain ``token``: it is shown only this once."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id, Role.MAINTAINER)
        row, plain = await agents.create_token(session, principal, agent, body.name, body.description)
        return AgentTokenCreated(**agent_token_out(row).model_dump(), token=plain)


@router.delete(_BASE + "/{token_id}", status_code=204, summary="Revoke an agent token")
async def revoke_token(state: State, principal: Writer, project_id: str, agent_id: RowId, token_id: RowId) -> Response:
    """Maintainer or above. kas refuses the token from its next authentication on."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id, Role.MAINTAINER)
        token = await agents.get_token(session, agent, token_id)
        agents.revoke_token(token)
        digest = token.token_digest
        pending = await record_revocation(session, state, agent_id, [digest])
    await announce_revoked_tokens(state, agent_id, [digest], pending)
    return Response(status_code=204)
