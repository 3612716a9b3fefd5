"""REST paths GitLab clients (glab) call besides the resources: instance metadata and descendant groups.

* ``GET /metadata`` (GitLab "Metadata API"): version, revision, kas addresses and ``enterprise``. glab's
  ``cluster graph`` and ``cluster agent update-kubeconfig`` read ``kas.externalK8sProxyUrl`` from it first.
  Any valid token may read it, as on GitLab.
* ``GET /groups/:id/descendant_groups`` (GitLab "Groups API"): every subgroup at any depth, which glab's
  ``cluster agent check_manifest_usage`` walks.
* ``GET /projects/:id/repository/files/:path/raw`` (GitLab "Repository files API"): the hub has no repositories;
  the only files are the agents' configuration files, ``.gitlab/agents/<agent>/config.yaml``, which
  ``check_manifest_usage`` reads.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select

from tether import __version__
from tether.hub.api.auth import Authenticated, Reader
from tether.hub.api.deps import Paging, State, ref
from tether.hub.api.pagination import fetch_page, set_headers
from tether.hub.api.schemas_out import GroupOut, group_out
from tether.hub.db.namespaces import KIND_GROUP, Namespace
from tether.hub.errors import NotFound, Unauthorized
from tether.hub.gitaly import configuration_file
from tether.hub.roles import Role
from tether.hub.service.access import require_group_level, require_project_level
from tether.hub.service.paths import find_group, find_project

router = APIRouter(tags=["meta"])


@router.get("/metadata", summary="Instance metadata (GitLab Metadata API)")
async def metadata(state: State, _principal: Authenticated) -> dict[str, Any]:
    """``version``, ``revision``, ``kas{enabled, externalUrl, externalK8sProxyUrl, version}``, ``enterprise``.

    The kas addresses come from the hub configuration (``kas.external_url``, ``kas.k8s_proxy_url``,
    filled in by ``tether up``); ``kas.enabled`` is true when ``kas.external_url`` is set.
    """
    kas = state.config.kas
    return {
        "version": __version__,
        "revision": "tether",
        "kas": {
            "enabled": kas.external_url is not None,
            "externalUrl": kas.external_url,
            "externalK8sProxyUrl": kas.k8s_proxy_url,
            "version": (kas.version or __version__) if kas.external_url is not None else None,
        },
        "enterprise": False,
    }


@router.get("/groups/{group_id}/descendant_groups", tags=["groups"], summary="List a group's descendant groups")
async def list_descendant_groups(
    request: Request, response: Response, state: State, principal: Reader, paging: Paging, group_id: str
) -> list[GroupOut]:
    """Subgroups at any depth, by id; needs Guest on the group (membership is inherited by every subgroup)."""
    async with state.db.transaction() as session:
        group = await find_group(session, ref(group_id))
        await require_group_level(session, principal, group, Role.GUEST)
        query = (
            select(Namespace)
            .where(Namespace.kind == KIND_GROUP, Namespace.full_path.startswith(group.full_path + "/", autoescape=True))
            .order_by(Namespace.id)
        )
        items, total = await fetch_page(session, query, paging)
    set_headers(request, response, paging, total)
    return [group_out(g, state.config.base_url) for g in items]


@router.get("/job/allowed_agents", tags=["internal (kas)"], summary="Agents a CI job may use (no CI in Tether)")
async def allowed_agents() -> None:
    """GitLab answers this for a CI job token (``JOB-TOKEN``); Tether runs no CI jobs, so no token is valid: 401."""
    raise Unauthorized()


@router.get(
    "/projects/{project_id}/repository/files/{file_path}/raw", tags=["projects"], summary="An agent configuration file"
)
async def raw_file(
    state: State,
    principal: Reader,
    project_id: str,
    file_path: str,
    _ref: Annotated[str | None, Query(alias="ref", max_length=255)] = None,
) -> Response:
    """The raw YAML of ``.gitlab/agents/<agent>/config.yaml`` (``file_path`` URL-encoded); Developer or above.

    ``ref`` is accepted and ignored (there is no history). Any other path, or an agent without a configuration,
    is ``404 File Not Found``.
    """
    async with state.db.transaction() as session:
        project = await find_project(session, ref(project_id))
        await require_project_level(session, principal, project, Role.DEVELOPER)
        content = await configuration_file(session, project, ref(file_path))
    if content is None:
        raise NotFound("File")
    return Response(content.encode(), media_type="text/plain; charset=utf-8")
