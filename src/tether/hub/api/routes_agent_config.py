"""``/projects/:id/cluster_agents/:agent_id/configuration``: Tether's endpoint for an agent's configuration file.

Upstream keeps the file in the project's repository (``.gitlab/agents/<name>/config.yaml``); the hub keeps it in
its database. ``PUT`` takes the YAML as the request body.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from tether.hub.agent_config import MAX_SIZE_BYTES
from tether.hub.api.auth import Reader, Writer
from tether.hub.api.deps import State, ref
from tether.hub.api.schemas_out import ConfigurationOut, configuration_out
from tether.hub.errors import BadRequest
from tether.hub.ids import RowId
from tether.hub.roles import Role
from tether.hub.service import agents
from tether.hub.service.paths import find_project

router = APIRouter(tags=["cluster agents"])
_PATH = "/projects/{project_id}/cluster_agents/{agent_id}/configuration"
_YAML_BODY = {
    "requestBody": {
        "required": True,
        "description": "The configuration file (YAML), at most 128 KiB.",
        "content": {"application/yaml": {"schema": {"type": "string"}}, "text/plain": {"schema": {"type": "string"}}},
    }
}


@router.get(_PATH, summary="Get an agent's configuration file")
async def get_configuration(state: State, principal: Reader, project_id: str, agent_id: RowId) -> ConfigurationOut:
    """Developer or above. Version 0 and empty content before any configuration was set."""
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id)
        return configuration_out(agent, await agents.get_configuration(session, agent))


@router.put(_PATH, summary="Set an agent's configuration file", openapi_extra=_YAML_BODY)
async def put_configuration(
    request: Request, state: State, principal: Writer, project_id: str, agent_id: RowId
) -> ConfigurationOut:
    """Maintainer or above. 400 naming the field when the YAML is invalid; nothing is stored then."""
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_SIZE_BYTES:
            raise BadRequest.field("configuration", f"is too large (maximum is {MAX_SIZE_BYTES} bytes)")
    try:
        content = raw.decode()
    except UnicodeDecodeError as exc:
        raise BadRequest.field("configuration", "is not UTF-8 text") from exc
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        agent = await agents.get_agent(session, principal, project, agent_id, Role.MAINTAINER)
        return configuration_out(agent, await agents.set_configuration(session, principal, agent, content))
