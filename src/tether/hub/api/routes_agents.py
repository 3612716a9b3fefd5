"""``/projects/:id/cluster_agents`` (GitLab "Agents API"), with live connections on the single-agent resource."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from tether.hub.api.auth import Reader, Writer
from tether.hub.api.connections import agent_connections, announce_revoked_tokens, record_revocation
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import fetch_page, set_headers
from tether.hub.api.schemas_in import AgentCreate
from tether.hub.api.schemas_out import AgentDetailOut, AgentOut, agent_out
from tether.hub.ids import RowId
from tether.hub.roles import Role
from tether.hub.service import agents
from tether.hub.service.paths import find_project

router = APIRouter(tags=["cluster agents"])


@router.get("/projects/{project_id}/cluster_agents", summary="List a project's agents")
async def list_agents(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, project_id: str
) -> list[AgentOut]:
    """Developer or above."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        await agents.readable_project(session, principal, project)
        items, total = await fetch_page(session, agents.agents_query(project), paging)
    set_headers(request, response, paging, total)
    return [agent_out(a, project) for a in items]


@router.get("/projects/{project_id}/cluster_agents/{agent_id}", summary="Get an agent and its live connections")
async def get_agent(state: State, principal: Reader, project_id: str, agent_id: RowId) -> AgentDetailOut:
    """Developer or above.

    ``connections`` come from kas; when kas cannot be asked the list is empty and ``connections_error`` says why.
    """
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id)
    connections, error = await agent_connections(state, agent.id)
    return AgentDetailOut(**agent_out(agent, project).model_dump(), connections=connections, connections_error=error)


@router.post("/projects/{project_id}/cluster_agents", status_code=201, summary="Register an agent")
async def create_agent(state: State, principal: Writer, project_id: str, body: AgentCreate) -> AgentOut:
    """Maintainer or above. 400 for an invalid name, 409 when the project has an agent of that name."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.create_agent(session, principal, project, body.name)
        return agent_out(agent, project)


@router.delete("/projects/{project_id}/cluster_agents/{agent_id}", status_code=204, summary="Delete an agent")
async def delete_agent(state: State, principal: Writer, project_id: str, agent_id: RowId) -> Response:
    """Maintainer or above; the agent's tokens stop working."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id, Role.MAINTAINER)
        digests = [t.token_digest for t in await session.scalars(agents.active_tokens_query(agent))]
        await agents.delete_agent(session, agent)
        pending = await record_revocation(session, state, agent_id, digests)
    await announce_revoked_tokens(state, agent_id, digests, pending)
    return Response(status_code=204)
