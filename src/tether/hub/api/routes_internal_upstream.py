"""Internal API endpoints upstream kas (16.x-18.x) calls that Tether kas does not (docs/interop.md).

Same authentication as every internal call (the kas JWT, checked by the middleware and ``require_kas_jwt``);
calls on behalf of an agent carry its token. Each answers with GitLab's JSON or status, or a documented refusal
that upstream kas handles:

* ``POST usage_metrics`` and ``POST agent_events``: accepted (204) and logged at debug; the hub keeps no usage
  statistics.
* ``POST agent_configuration``: 204 for a known agent, 404 otherwise (GitLab's answers). The hub already holds
  the configuration kas read (it served it, see :mod:`tether.hub.gitaly`), so the body is not stored.
* ``GET project_info`` / ``GET verify_project_access``: the agent may reach its own project and the projects
  under the same top-level group (404 otherwise, which kas treats as "no access").
* ``GET receptive_agents``: no agent accepts connections from kas in Tether: ``{"agents": []}``.
* ``modules/...`` (agentk modules' GitLab calls: starboard_vulnerability, remote_development) and ``agent/...``:
  404 naming the refusal; kas passes it to the agentk module, which backs off.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from tether.hub.api.routes_internal import AgentToken, require_kas_jwt
from tether.hub.api.state import hub_state
from tether.hub.db.agents import ClusterAgent
from tether.hub.db.namespaces import Project
from tether.hub.errors import NotFound
from tether.hub.gitaly import repository_for
from tether.hub.service import internal
from tether.hub.service.paths import find_project

log = logging.getLogger(__name__)

router = APIRouter(prefix="/internal/kubernetes", tags=["internal (kas)"], dependencies=[Depends(require_kas_jwt)])

#: Bounds on the usage bodies kas sends once a minute.
MAX_COUNTERS = 256
MAX_UNIQUE_VALUES = 100_000


class UsageMetrics(BaseModel):
    """Upstream ``UsagePingData``: counter name -> count, and counter name -> unique ids."""

    model_config = ConfigDict(extra="forbid")

    counters: dict[str, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, max_length=MAX_COUNTERS)
    unique_counters: dict[str, Annotated[list[int], Field(max_length=MAX_UNIQUE_VALUES)]] = Field(
        default_factory=dict, max_length=MAX_COUNTERS
    )


class AgentEvents(BaseModel):
    """Upstream ``agent_events`` body: event name -> list of event objects (user and project ids)."""

    model_config = ConfigDict(extra="forbid")

    events: dict[str, Annotated[list[dict[str, Any]], Field(max_length=MAX_UNIQUE_VALUES)]] = Field(
        default_factory=dict, max_length=MAX_COUNTERS
    )


class PostedAgentConfiguration(BaseModel):
    """Upstream ``AgentConfigurationRequest``: the agent id and the configuration kas read."""

    model_config = ConfigDict(extra="forbid")

    agent_id: int
    agent_config: dict[str, Any] = Field(default_factory=dict)


@router.post("/usage_metrics", status_code=204, summary="Usage counters from kas (accepted, not stored)")
async def usage_metrics(body: UsageMetrics) -> Response:
    """204; 400 for a malformed body."""
    log.debug("usage metrics from kas: %s", body.counters)
    return Response(status_code=204)


@router.post("/agent_events", status_code=204, summary="Usage events from kas (accepted, not stored)")
async def agent_events(body: AgentEvents) -> Response:
    """204; 400 for a malformed body."""
    log.debug("agent events from kas: %s", {name: len(items) for name, items in body.events.items()})
    return Response(status_code=204)


@router.post("/agent_configuration", status_code=204, summary="The configuration kas read for an agent")
async def post_agent_configuration(request: Request, body: PostedAgentConfiguration) -> Response:
    """204 for a known agent (the body is not stored: the hub is where the configuration lives); 404 otherwise."""
    async with hub_state(request).db.transaction() as session:
        if await session.get(ClusterAgent, body.agent_id) is None:
            raise NotFound("Agent")
    return Response(status_code=204)


async def _reachable_project(request: Request, token: str, project_ref: str) -> Project:
    state = hub_state(request)
    owner = await internal.agent_for_token(state.db, state.token_uses, token)
    async with state.db.transaction() as session:
        project = await find_project(session, project_ref)
    if not _same_root(owner.project, project):
        raise NotFound("Project")
    return project


def _same_root(own: internal.ProjectRef, other: Project) -> bool:
    return own.id == other.id or own.full_path.split("/", 1)[0] == other.full_path.split("/", 1)[0]


ProjectRef = Annotated[str, Query(alias="id", min_length=1, max_length=2048, description="Project id or full path")]


@router.get("/project_info", summary="Gitaly location of a project the agent may reach")
async def project_info(request: Request, token: AgentToken, project_ref: ProjectRef) -> dict[str, Any]:
    """``GetProjectInfoResponse`` JSON; 401 bad agent token, 404 unknown or unreachable project."""
    state = hub_state(request)
    project = await _reachable_project(request, token, project_ref)
    return {
        "project_id": project.id,
        "gitaly_info": {"address": state.config.gitaly_address, "token": state.gitaly_token, "features": {}},
        "gitaly_repository": repository_for(project.id, project.full_path),
        "default_branch": project.default_branch,
    }


@router.get("/verify_project_access", status_code=204, summary="May the agent reach this project?")
async def verify_project_access(request: Request, token: AgentToken, project_ref: ProjectRef) -> Response:
    """204 when it may; 401 bad agent token; 404 unknown or unreachable project."""
    await _reachable_project(request, token, project_ref)
    return Response(status_code=204)


@router.get("/receptive_agents", summary="Agents kas should dial (none in Tether)")
async def receptive_agents() -> dict[str, Any]:
    """``{"agents": []}``: Tether agents always dial kas."""
    return {"agents": []}


@router.api_route("/modules/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def module_request(rest: str) -> None:
    """The agentk modules' GitLab calls (upstream ``gitlab_access``): Tether has none of those modules."""
    raise NotFound(f"Module {rest.split('/', 1)[0][:64]!r}")


@router.api_route("/agent/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def agent_request(rest: str) -> None:
    """Per-agent endpoints of later GitLab versions: not served."""
    raise NotFound("Agent Endpoint")
